// Number and token formatting shared by both pages. Pure functions, no DOM.

export function fmtProb(prob) {
  if (prob === null || prob === undefined || Number.isNaN(prob)) return "–";
  if (prob > 0 && prob < 0.001) return "<0.1%";
  return `${(prob * 100).toFixed(prob >= 0.995 || prob === 0 ? 0 : 1)}%`;
}

export function fmtMs(ms) {
  if (ms === null || ms === undefined) return "–";
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(ms < 10 ? 1 : 0)} ms`;
}

export function fmtBytes(numBytes) {
  if (numBytes === null || numBytes === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB"];
  let value = numBytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

export function fmtNum(value, digits = 2) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

/** "2054686520" -> "20 54 68 65" */
export function spacedHex(hex) {
  return (hex || "").replace(/(..)(?!$)/g, "$1 ");
}

/** A token piece with its whitespace made visible, for chips, labels and tooltips. */
export function visiblePiece(piece) {
  if (piece === "") return "∅";
  return piece.replace(/ /g, "·").replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/\r/g, "␍");
}

/**
 * A token's piece for display; a piece holding U+FFFD is part of a multi-byte character (its
 * bytes alone are no valid UTF-8), so its bytes are shown instead: "<0xE2 0x80>".
 */
export function tokenLabel(piece, hexBytes) {
  if (!piece.includes("\ufffd") || !hexBytes) return visiblePiece(piece);
  return `<${hexBytes.match(/../g).map((b) => `0x${b.toUpperCase()}`).join(" ")}>`;
}

export function probFromLogprob(logprob) {
  return logprob === null || logprob === undefined ? null : Math.exp(logprob);
}

/** A refused command or failed request as one line: "message (code)". */
export function errorText(error) {
  const hasCode = error.code && error.code !== "http_error";
  return hasCode ? `${error.message} (${error.code})` : error.message;
}
