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
/** How a sampling slider shows its value ("off" where the setting does nothing). */
export const SETTING_FORMATS = {
  temperature: (v) => (v === 0 ? "0 · greedy" : v.toFixed(2)),
  top_k: (v) => (v === 0 ? "off" : String(v)),
  top_p: (v) => (v >= 1 ? "off" : v.toFixed(2)),
  min_p: (v) => (v === 0 ? "off" : v.toFixed(2)),
};

/** A KL divergence in nats; null is infinite (JSON has no Infinity). */
export function fmtKl(kl) {
  return kl === null || kl === undefined ? "∞" : kl.toFixed(4);
}

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

/** The weight precision a model is served in, as the engine's model info reports it:
 * "bfloat16", or, per group of linear layers (file type → served form, counted), e.g.
 * "int4 weights: 12 Q4_K → int4 (the file's blocks), 132 Q5_0 → int8, 12 Q6_K → int8, 12 Q8_0 → int8,
 * head Q8_0 → int8 · bfloat16 activations". */
export function precisionLabel(info) {
  const q = info.quantization;
  if (!q) return info.precision || info.dtype;
  const groups = (q.groups ?? []).map((g) => {
    const what = g.is_head ? `head${g.file_type ? ` ${g.file_type}` : ""}` : `${g.num_layers} ${g.file_type || "layers"}`;
    const form = g.is_head && q.is_head_tied ? `${g.served_as}, tied to the embeddings` : g.served_as;
    return `${what} → ${form}${g.is_exact ? " (the file's blocks)" : ""}`;
  });
  return `${info.precision} weights${groups.length ? `: ${groups.join(", ")}` : ""} · ${info.dtype} activations`;
}

/** 8.61e9, "FLOP" -> "8.61 GFLOP": three significant digits, decimal (SI) prefixes. */
export function fmtSi(value, unit = "") {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  const prefixes = ["", "k", "M", "G", "T", "P", "E"];
  let scaled = Math.abs(value);
  let i = 0;
  while (scaled >= 999.5 && i < prefixes.length - 1) { scaled /= 1000; i += 1; }
  const digits = scaled >= 99.95 ? 0 : scaled >= 9.995 ? 1 : 2;
  return `${(Math.sign(value) * scaled).toFixed(digits)} ${prefixes[i]}${unit}`.trimEnd();
}
