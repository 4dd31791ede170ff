// Client-side logits processors for the explorer's sliders: the same processors, order and
// tie rules as inference/logits.py (temperature -> top-k -> top-p -> min-p), applied to the
// raw top-N alternatives a step reports and renormalized over those N tokens only (the tail
// beyond them is unknown here). Pure functions, no DOM.

/**
 * @param {{token_id: number, logprob: number}[]} alternatives raw top-N, any order
 * @param {{temperature: number, top_k: number, top_p: number, min_p: number}} params
 * @returns {Map<number, number>} token_id -> processed probability (0 when filtered)
 */
export function processedProbs(alternatives, { temperature, top_k, top_p, min_p }) {
  let logits = alternatives.map((a) => a.logprob);
  // Greedy decoding (temperature 0) skips every processor (inference.sampling.logits.build_processors).
  if (temperature > 0) {
    if (temperature !== 1) logits = logits.map((x) => x / temperature);
    if (top_k > 0) logits = topK(logits, top_k);
    if (top_p < 1) logits = topP(logits, top_p);
    if (min_p > 0) logits = minP(logits, min_p);
  }
  const probs = softmax(logits);
  return new Map(alternatives.map((a, i) => [a.token_id, probs[i]]));
}

export function softmax(logits) {
  const max = Math.max(...logits);
  const exps = logits.map((x) => (x === -Infinity ? 0 : Math.exp(x - max)));
  const total = exps.reduce((a, b) => a + b, 0);
  return exps.map((e) => e / total);
}

/** Keep the k highest; every logit tied with the k-th survives too. */
export function topK(logits, k) {
  if (k >= logits.length) return logits;
  const kth = [...logits].sort((a, b) => b - a)[k - 1];
  return logits.map((x) => (x < kth ? -Infinity : x));
}

/** Nucleus: ascending sort, drop the prefix whose cumulative probability is <= 1 - p, keep the top one. */
export function topP(logits, p) {
  const probs = softmax(logits);
  const order = logits.map((_, i) => i).sort((a, b) => logits[a] - logits[b]);
  const out = [...logits];
  let cumulative = 0;
  order.forEach((i, n) => {
    cumulative += probs[i];
    if (cumulative <= 1 - p && n < order.length - 1) out[i] = -Infinity;
  });
  return out;
}

/** Keep tokens whose probability is at least p times the most likely one's. */
export function minP(logits, p) {
  const probs = softmax(logits);
  const threshold = p * Math.max(...probs);
  return logits.map((x, i) => (probs[i] < threshold ? -Infinity : x));
}
