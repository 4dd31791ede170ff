// The explorer's settings in its URL, so another page (the lesson) can link into it with the
// same settings: /explorer/?text=...&chat=1&temperature=0.3&top_k=5&run=32&kv_cache=0&pd=1
// (&grammar_kind=choice&grammar=yes%0Ano: the grammar field's kind and text, static/js/grammar.js;
// &speculative=prompt_lookup: the speculation select).
// Owns: the query's names and their checks, both ways. Must not know the explorer's DOM.

// name in the query -> [kind, min, max] (values outside are ignored, not clamped silently)
const NUMBERS = {
  temperature: ["float", 0, 2],
  top_k: ["int", 0, 50],
  top_p: ["float", 0.05, 1],
  min_p: ["float", 0, 0.5],
  seed: ["int", 0, Number.MAX_SAFE_INTEGER],
  beams: ["int", 1, 4],
  run: ["int", 2, 64],
  model: ["int", 1, Number.MAX_SAFE_INTEGER],
};
const FLAGS = ["chat", "kv_cache", "prefix_cache", "pd"];
const GRAMMAR_KINDS = ["json_schema", "regex", "choice"];
const SPECULATIVE = ["off", "prompt_lookup"];

/** "/explorer/?..." for `settings` ({text, chat, temperature, top_k, ..., run, kv_cache, pd}). */
export function explorerUrl(settings) {
  const query = new URLSearchParams();
  if (settings.text) query.set("text", settings.text);
  for (const name of Object.keys(NUMBERS)) {
    if (settings[name] !== undefined && settings[name] !== null) query.set(name, String(settings[name]));
  }
  for (const name of FLAGS) {
    if (settings[name] !== undefined) query.set(name, settings[name] ? "1" : "0");
  }
  if (GRAMMAR_KINDS.includes(settings.grammar_kind) && settings.grammar) {
    query.set("grammar_kind", settings.grammar_kind);
    query.set("grammar", settings.grammar);
  }
  if (SPECULATIVE.includes(settings.speculative)) query.set("speculative", settings.speculative);
  return `/explorer/?${query}`;
}

/** The settings a URL's query carries (only valid ones): the inverse of explorerUrl. */
export function readExplorerUrl(search) {
  const query = new URLSearchParams(search);
  const settings = {};
  if (query.has("text")) settings.text = query.get("text");
  for (const [name, [kind, min, max]] of Object.entries(NUMBERS)) {
    const raw = query.get(name);
    if (raw === null || raw.trim() === "") continue;
    const value = Number(raw);
    if (!Number.isFinite(value) || value < min || value > max || (kind === "int" && !Number.isInteger(value))) continue;
    settings[name] = value;
  }
  for (const name of FLAGS) {
    if (query.get(name) === "1" || query.get(name) === "0") settings[name] = query.get(name) === "1";
  }
  if (GRAMMAR_KINDS.includes(query.get("grammar_kind")) && query.get("grammar")) {
    settings.grammar_kind = query.get("grammar_kind");
    settings.grammar = query.get("grammar");
  }
  if (SPECULATIVE.includes(query.get("speculative"))) settings.speculative = query.get("speculative");
  return settings;
}
