// Client-side logits processors for the explorer's sliders: the same processors, order and
// tie rules as inference/logits.py (temperature -> top-k -> top-p -> min-p), applied to the
// raw top-N alternatives a step reports and renormalized over those N tokens only (the tail
// beyond them is unknown here), and when that preview is exact. Also the one rule for what
// greedy decoding draws from. Pure functions, no DOM.

/** Whether `params` (SamplingParams as the server sends them) pick each token by argmax:
 * `greedy`, or temperature 0 (SamplingParams.is_greedy); beam search is not greedy. */
export function isGreedy(params) {
  return Boolean(params) && (params.greedy === true || params.temperature === 0) && !(params.num_beams > 1);
}

/**
 * `step` as the distribution its token was drawn from. Greedy draws nothing: it takes the top
 * token of the processed scores with probability 1, so the drawn distribution is all on that
 * token (`logprob` 0 for it, −∞ for any other, e.g. one the thinking budget forced). The
 * engine's records keep the model's (penalized) probabilities there, as the OpenAI API
 * reports them; every page shows greedy as this point mass (the A/B alignment computes it so).
 */
export function asDrawn(step, params) {
  if (!isGreedy(params) || !step) return step;
  const top = step.top_processed?.[0] ?? { token_id: step.token_id, piece: step.piece };
  return { ...step, logprob: top.token_id === step.token_id ? 0 : -Infinity,
    top_processed: [{ ...top, prob: 1, logprob: 0 }] };
}

/**
 * @param {{token_id: number, logprob: number}[]} alternatives raw top-N, most likely first
 * @param {{temperature: number, top_k: number, top_p: number, min_p: number, repetition_penalty?: number}} params
 * @returns {Map<number, number>} token_id -> processed probability (0 when filtered), with
 *   `.isExact`: whether these numbers are the engine's over the whole vocabulary (see
 *   `isPreviewExact`); `.isKnown` false when nothing can be previewed (a repetition penalty
 *   needs the raw scores, which a step does not report).
 */
export function processedProbs(alternatives, params) {
  const { temperature, top_k, top_p, min_p } = params;
  if ((params.repetition_penalty ?? 1) !== 1) return Object.assign(new Map(), { isExact: false, isKnown: false });
  let logits = alternatives.map((a) => a.logprob);
  let probs;
  if (temperature === 1 && !(top_k > 0) && !(top_p < 1) && !(min_p > 0)) {
    probs = logits.map(Math.exp);  // nothing changes the model's distribution: the raw numbers themselves
  } else if (temperature === 0) {
    // Greedy: all of the probability on the most likely token.
    const best = logits.indexOf(Math.max(...logits));
    probs = logits.map((_, i) => (i === best ? 1 : 0));
  } else {
    if (temperature !== 1) logits = logits.map((x) => x / temperature);
    if (top_k > 0) logits = topK(logits, top_k);
    if (top_p < 1) logits = topP(logits, top_p);
    if (min_p > 0) logits = minP(logits, min_p);
    probs = softmax(logits);
  }
  const result = new Map(alternatives.map((a, i) => [a.token_id, probs[i]]));
  return Object.assign(result, { isExact: isPreviewExact(alternatives, params), isKnown: true });
}

/**
 * Whether renormalizing over the listed tokens gives the engine's exact numbers: when every
 * token the settings keep is listed (greedy; top-k within the list; min-p whose threshold lies
 * above the last listed token), or when nothing changes the distribution. Top-p after a
 * temperature, or a temperature alone, depend on the unlisted tail: not exact.
 */
export function isPreviewExact(alternatives, { temperature, top_k, top_p, min_p, repetition_penalty = 1 }) {
  if (repetition_penalty !== 1) return false;
  if (temperature === 0) return true;
  if (top_k > 0 && top_k <= alternatives.length) return true;
  if (top_p < 1) return false;
  if (min_p > 0) {
    // min-p keeps q >= min_p * q_max on the tempered distribution: p >= min_p^T * p_max on the raw one.
    const probs = alternatives.map((a) => Math.exp(a.logprob));
    return Math.min(...probs) < min_p ** temperature * Math.max(...probs);
  }
  return temperature === 1;
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
