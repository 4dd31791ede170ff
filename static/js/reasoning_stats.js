// How much of an answer was thinking. Owns: counting each reasoning block's tokens from the
// engine's own `is_reasoning` step flags (never by splitting text here) and the note drawn
// beside the block ("thinking: 42 tokens, 63% of the answer"). Pure functions, no DOM.
import { interpolate, ngettext } from "./i18n.js";

/**
 * Tokens per segment (an array over `segments`, 0 for answer segments). A reasoning step
 * belongs to the last reasoning block that starts at or before where its text starts
 * (offsets in UTF-16 units, like the segments'). Without steps (a message from history whose
 * steps are not loaded) a single block gets the stats' `num_reasoning_tokens`.
 */
export function reasoningTokenCounts(steps, segments, stats = null) {
  const counts = segments.map(() => 0);
  const blocks = segments.map((s, n) => (s.kind === "reasoning" ? n : -1)).filter((n) => n >= 0);
  if (!blocks.length) return counts;
  if (!steps.length) {
    if (blocks.length === 1 && stats?.num_reasoning_tokens) counts[blocks[0]] = stats.num_reasoning_tokens;
    return counts;
  }
  let offset = 0;
  for (const step of steps) {
    if (step.is_reasoning) {
      const owner = blocks.filter((n) => segments[n].start <= offset).pop() ?? blocks[0];
      counts[owner] += 1;
    }
    offset += step.text_delta.length;
  }
  return counts;
}

/** "thinking: 42 tokens, 63% of the answer" (`numOutputTokens`: every generated token). */
export function thinkingNote(numTokens, numOutputTokens) {
  const share = numOutputTokens ? Math.round((100 * numTokens) / numOutputTokens) : 0;
  return interpolate(ngettext("thinking: %(n)s token, %(share)s of the answer", "thinking: %(n)s tokens, %(share)s of the answer", numTokens),
    { n: numTokens, share: `${share}%` });
}

/** The note for each segment (undefined for answer segments and blocks with no count). */
export function reasoningNotes(steps, segments, stats = null) {
  const numOutputTokens = stats?.num_generated_tokens ?? steps.length;
  return reasoningTokenCounts(steps, segments, stats).map((count, n) =>
    segments[n].kind === "reasoning" && (count || steps.length) ? thinkingNote(count, numOutputTokens) : undefined);
}
