#!/usr/bin/env bash
# Refresh the front-end libraries committed under static/vendor/.
#
# The vendored files are committed, so neither npm nor the network is needed to run the
# playground or its tests; run this only to upgrade a library (bump package.json first).
# Only self-contained browser builds are copied, each next to its licence, with their source
# maps (Django's manifest static storage follows `sourceMappingURL` and fails on a missing map).
set -euo pipefail
cd "$(dirname "$0")/.."

npm ci --no-audit --no-fund

vendor() {  # vendor <lib> <files...>: copy into static/vendor/<lib>/
    local lib=$1; shift
    rm -rf "static/vendor/$lib"
    mkdir -p "static/vendor/$lib"
    cp "$@" "static/vendor/$lib/"
}

# Chart.js: the UMD build bundles its one dependency (@kurkle/color, MIT); the ESM build
# does not, so the page loads the UMD file with a classic <script> (global `Chart`).
vendor chart.js node_modules/chart.js/dist/chart.umd.min.js{,.map} node_modules/chart.js/LICENSE.md
cp node_modules/@kurkle/color/LICENSE.md static/vendor/chart.js/LICENSE-kurkle-color.md
vendor marked node_modules/marked/lib/marked.esm.js{,.map} node_modules/marked/LICENSE
vendor dompurify node_modules/dompurify/dist/purify.es.mjs{,.map} \
    node_modules/dompurify/LICENSE node_modules/dompurify/LICENSE-MPL

node -e 'for (const l of ["chart.js", "marked", "dompurify"]) console.log(l, require(`./node_modules/${l}/package.json`).version)' \
    > static/vendor/VERSIONS
cat static/vendor/VERSIONS
