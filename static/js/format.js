// Number and token formatting shared by both pages. Pure functions, no DOM.
import { gettext, interpolate, language, ngettext, pgettext } from "./i18n.js";

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

/** A count of parameters as papers write them: 134515008 -> "135M", 671026419712 -> "671.0B". */
export function fmtCount(n) {
  if (n == null) return "?";
  if (n >= 1e9) return `${(n / 1e9).toFixed(1)}B`;
  if (n >= 1e6) return `${Math.round(n / 1e6)}M`;
  return n.toLocaleString();
}

/** "1 step", "3 steps" in the page's language: how many `n` of them (ngettext). */
export function numSteps(n) {
  return interpolate(ngettext("%(n)s step", "%(n)s steps", n), { n: n.toLocaleString() });
}

/** How a sampling slider shows its value ("off" where the setting does nothing). */
export const SETTING_FORMATS = {
  temperature: (v) => (v === 0 ? gettext("0 · greedy") : v.toFixed(2)),
  top_k: (v) => (v === 0 ? gettext("off") : String(v)),
  top_p: (v) => (v >= 1 ? gettext("off") : v.toFixed(2)),
  min_p: (v) => (v === 0 ? gettext("off") : v.toFixed(2)),
  repetition_penalty: (v) => (v === 1 ? gettext("off") : v.toFixed(2)),
};

/** A KL divergence in nats; null is infinite (JSON has no Infinity). */
export function fmtKl(kl) {
  return kl === null || kl === undefined ? "∞" : kl.toFixed(4);
}

/** "2054686520" -> "20 54 68 65" */
export function spacedHex(hex) {
  return (hex || "").replace(/(..)(?!$)/g, "$1 ");
}

/**
 * A token piece with its whitespace made visible, for chips, labels and tooltips; a part of a
 * multi-byte character (U+FFFD: its bytes alone are no valid UTF-8, as in an alternatives table,
 * which lists no bytes) shows as "<part of a character>", never "�" (`tokenLabel` shows the bytes).
 */
export function visiblePiece(piece) {
  if (piece === "") return "∅";
  const shown = piece.replace(/ /g, "·").replace(/\n/g, "↵").replace(/\t/g, "⇥").replace(/\r/g, "␍");
  return shown.replace(/\ufffd+/g, `<${gettext("part of a character")}>`);
}

/**
 * A token's piece for display; a piece holding U+FFFD is part of a multi-byte character (its
 * bytes alone are no valid UTF-8), so its bytes are shown instead: "<0xE2 0x80>", or, where they
 * are not at hand (an alternative lists no bytes), "<part of a character>", never "�".
 */
export function tokenLabel(piece, hexBytes = "") {
  if (!piece.includes("\ufffd") || !hexBytes) return visiblePiece(piece);
  return `<${byteList(hexBytes)}>`;
}

/** "f09f" -> "0xF0 0x9F" */
function byteList(hexBytes) {
  return hexBytes.match(/../g).map((b) => `0x${b.toUpperCase()}`).join(" ");
}

const CUT_FINISHES = ["length", "context", "cancelled"];  // the ends that may fall inside a character

/**
 * The bytes a generation held back when it ended inside a multi-byte character (max tokens, a
 * stop): its last step's text then ends with U+FFFD, which the pages leave out and say so
 * instead of showing "�". -> "0xF0 0x9F" ("" when the step has no bytes), or null when no
 * character was cut (still streaming, another end, a whole last character, a real U+FFFD).
 */
export function cutCharacterBytes(lastStep, finishReason) {
  if (!CUT_FINISHES.includes(finishReason) || !lastStep?.text_delta?.endsWith("\ufffd")) return null;
  if (lastStep.token_bytes?.toLowerCase().endsWith("efbfbd")) return null;  // a real U+FFFD
  return lastStep.token_bytes ? byteList(lastStep.token_bytes) : "";
}

/**
 * Each step's share of a generation's text as the chat shows it: its `text_delta`, so a
 * character spread over several tokens shows whole at its last one (the others add nothing)
 * instead of one "�" per token, and a character cut by the end left out (`cutBytes`, said so).
 * `finishReason` is null while it streams. -> {texts, cutBytes}
 */
export function stepTexts(steps, finishReason) {
  const texts = steps.map((s) => s.text_delta ?? s.piece);
  const cutBytes = cutCharacterBytes(steps.at(-1), finishReason);
  if (cutBytes !== null) texts[texts.length - 1] = texts.at(-1).replace(/\ufffd+$/, "");
  return { texts, cutBytes };
}

/**
 * Whether a seed field's text is a seed: a whole number a browser holds exactly (up to 2**53 - 1,
 * Number.MAX_SAFE_INTEGER, which is the server's limit too); a larger one would be sent rounded.
 */
export function isSeed(text) {
  return /^\d+$/.test(text) && Number.isSafeInteger(Number(text));
}

/** What the page says of a seed field that holds no seed. */
export function seedError(text) {
  return { message: interpolate(gettext("Seed “%(seed)s” must be a whole number from 0 to %(max)s."),
    { seed: text, max: Number.MAX_SAFE_INTEGER }) };
}

export function probFromLogprob(logprob) {
  return logprob === null || logprob === undefined ? null : Math.exp(logprob);
}

// What each error a worker writes means, in the page's language. The web process words its own
// refusals in the page's language; a worker's message (generation.error, an inspection's
// failure) is written where the page's language is unknown, in English, so the page says what
// its stable code means instead (the English message stays on the event).
const WORKER_ERRORS = {
  worker_lost: () => gettext("The worker running this request stopped. The answer so far is kept; try again."),
  internal_error: () => gettext("The server failed to finish this request. The answer so far is kept; try again."),
  model_unavailable: () => gettext("The model could not be loaded or is not available."),
  kv_handoff_failed: () => gettext("The KV cache could not be handed from the prefill worker to the decode worker."),
  images_not_supported: () => gettext("This model takes no images: choose a vision-language model."),
  inspection_timeout: () => gettext("No worker answered in time: is a generation worker running?"),
  not_moe: () => gettext("This model is dense: it has no experts to show."),
  not_comparable: () => gettext("These two generations cannot be compared: they ran different models or texts."),
  service_unavailable: () => gettext("The server lost its connection to Redis (its message broker) or this request's task: "
    + "the answer so far is kept. Try again in a moment."),
};

/** A refused command or failed request as one line: "message (code)". */
export function errorText(error) {
  const hasCode = error.code && error.code !== "http_error";
  const message = language !== "en" && WORKER_ERRORS[error.code] ? WORKER_ERRORS[error.code]() : error.message;
  return hasCode ? `${message} (${error.code})` : message;
}

/** The weight precision a model is served in, as the engine's model info reports it:
 * "bfloat16", or, per group of linear layers (file type → served form, counted), e.g.
 * "int4 weights: 12 Q4_K → int4 (the file's blocks), 132 Q5_0 → int8, 12 Q6_K → int8, 12 Q8_0 → int8,
 * head Q8_0 → int8 · bfloat16 activations", or under gguf "132 Q5_0 as the file stores it, ...". */
export function precisionLabel(info) {
  const q = info.quantization;
  if (!q) return info.precision || info.dtype;
  const groups = (q.groups ?? []).map((g) => {
    const what = g.is_head
      ? (g.file_type ? interpolate(gettext("head %(type)s"), { type: g.file_type }) : pgettext("output layer", "head"))
      : `${g.num_layers} ${g.file_type || gettext("layers")}`;
    if (g.served_as === "blocks") return `${what} ${gettext("as the file stores it")}`;  // precision gguf
    const form = g.is_head && q.is_head_tied ? interpolate(gettext("%(form)s, tied to the embeddings"), { form: g.served_as }) : g.served_as;
    return `${what} → ${form}${g.is_exact ? ` ${gettext("(the file's blocks)")}` : ""}`;
  });
  return interpolate(gettext("%(precision)s weights%(groups)s · %(dtype)s activations"),
    { precision: info.precision, groups: groups.length ? `: ${groups.join(", ")}` : "", dtype: info.dtype });
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

/** Why a generation stopped: the stable `finish_reason` code (docs/protocol.md), in the page's language. */
export function finishReasonLabel(reason) {
  const labels = {
    eos: pgettext("finish reason", "eos"),
    length: pgettext("finish reason", "length"),
    stop_string: pgettext("finish reason", "stop_string"),
    context: pgettext("finish reason", "context"),
    cancelled: pgettext("finish reason", "cancelled"),
    error: pgettext("finish reason", "error"),
  };
  return labels[reason] ?? reason;
}

/** A step's `phase` ("prefill" or "decode") as the page shows it (technical terms: they stay as is in Chinese). */
export function phaseLabel(phase) {
  const labels = { prefill: pgettext("phase", "prefill"), decode: pgettext("phase", "decode") };
  return labels[phase] ?? phase;
}

// The sampling presets the project ships (migrations 0002 and 0014) are records, but their names are the
// product's own words: shown in the page's language. A preset someone adds keeps its name.
const SHIPPED_PRESETS = {
  Greedy: pgettext("preset", "Greedy"),
  "Greedy, no loops": pgettext("preset", "Greedy, no loops"),
  Balanced: pgettext("preset", "Balanced"),
  Creative: pgettext("preset", "Creative"),
  Precise: pgettext("preset", "Precise"),
  "Beam search": pgettext("preset", "Beam search"),
};

export function presetName(name) {
  return SHIPPED_PRESETS[name] ?? name;
}
