"""How much of a rendered page is in Chinese: the check behind "no visible English UI text
remains in zh-Hans".

Owns: collecting a page's UI strings (visible text nodes, and the title / placeholder /
aria-label a person reads on hover or with a screen reader), leaving out what is data rather
than UI (model output, token pieces, prompts, record names, code), and sorting each string into
translated (it has Chinese), English (an English word remains once the technical terms that stay
as they are in Chinese are taken out: KV Cache, Prefill, Decode, top-k, token, units...) or
neutral (numbers and symbols). Each English string is looked up in the catalogs, so the report
says whether a translation is missing or was not applied. Must not know any page's layout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from scripts.messages import LOCALE_DIR, read_po

REPORT_DIR = Path(__file__).resolve().parents[2] / "test-artifacts" / "i18n"

# Regions whose text is data, not UI: what the model wrote or read, records' names, code.
DATA_SELECTORS = ", ".join([
    ".msg-body", ".bubble", ".piece", ".chip", ".prompt-text", ".continuation", ".learn-answer", ".learn-draw",
    ".learn-trace", ".learn-path", ".learn-code", "code", "pre", ".mono", ".model-name", ".conv-title", "#chat-title",
    ".arch-name", ".pipe-meta", "#ex-model-label", ".beam-tree", ".beam-list", ".learn-routing", "textarea", "input",
    "#model-select", "#ex-model", "#ab-model", "#arch-model", ".picker-text", "#arch-dtype", "#lens-layer", ".sv-meta",
    ".sv-card-head",
    ".popover-head", ".alt-table td", ".inside-table td", ".attention-grid", ".moe-grid", "script", "style",
    "[data-i18n-data]",  # marked by a test: e.g. the admin's record values
    ".lang-switch button",  # each language named in itself: "English" stays English
])  # fmt: skip

# Terms that stay as they are in Chinese (the lesson writes them so), units, names.
TECHNICAL = re.compile(
    r"KV Cache|KV cache|Prefill|Decode|Argmax|Beam Search|Top-[kp]|Min-p|top-[kp]|min-p|tokens?|Tokenizer|Token|"
    r"Transformer|Embedding|softmax|logits?|logit lens|Roofline|Temperature|Key|Value|Compute-bound|Memory-bound|"
    r"Role Tagging|Jinja2|Hugging Face|DeepSeek(?:-V3|-R1|-VL2?|-V2-Lite)?|SmolLM2[\w.-]*|Qwen[\w.-]*|LLM|MoE|MLA|"
    r"RoPE|MLP|MHA|SigLIP|GGUF|JSON|CSV|API|EOS|PD|KL|TTFT|FLOPs?|beams?|worker|nats?|argmax|"
    r"float32|bfloat16|float16|int8|int4|fp8|cpu|cuda|lean-llama|torch|kv_b|lm|Enter|Shift|px|ctx|tok|id|"
    r"(?:[kMGTP]?(?:FLOP|B)/(?:s|byte|token)|[KMGT]i?B|ms|s)\b"
)
CHINESE = re.compile(r"[\u3400-\u9fff]")
ENGLISH_WORD = re.compile(r"[A-Za-z]{2,}")
# identifiers, paths, commands, dotted names and numbers, short acronyms ("A", "B", "QUEUES")
CODE_LIKE = re.compile(r"\S*[_/=]\S*|\S+\.\S+|\b[A-Z][A-Z0-9]{0,6}\b")

COLLECT = """(skip) => {
  const out = [];
  const seen = (el) => el.checkVisibility ? el.checkVisibility() : el.offsetParent !== null;
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const el = node.parentElement;
    const text = node.textContent.replace(/\\s+/g, " ").trim();
    if (text && el && !el.closest(skip) && seen(el)) out.push(text);
  }
  for (const el of document.querySelectorAll("[title], [placeholder], [aria-label]")) {
    if (el.closest(skip) && !el.matches("input, textarea, select")) continue;
    for (const name of ["title", "placeholder", "aria-label"]) {
      const value = (el.getAttribute(name) || "").replace(/\\s+/g, " ").trim();
      if (value) out.push(value);
    }
  }
  return out;
}"""


@dataclass
class Report:
    translated: set[str] = field(default_factory=set)
    english: dict[str, str] = field(default_factory=dict)  # string -> where it was seen
    pages: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        total = len(self.translated) + len(self.english)
        return len(self.translated) / total if total else 1.0

    def add(self, other: Report) -> None:
        self.translated |= other.translated
        self.english.update(other.english)
        self.pages += other.pages

    def summary(self) -> str:
        catalog = _catalog_msgids()
        lines = [
            f"{len(self.translated)} UI strings in Chinese, {len(self.english)} in English: "
            f"{self.ratio:.1%} translated, on {', '.join(self.pages)}"
        ]
        for text, where in sorted(self.english.items()):
            status = "in the catalog" if text in catalog else "not in the catalog"
            lines.append(f"  {where}: {text!r} ({status})")
        return "\n".join(lines)


def classify(text: str) -> str:
    """'translated', 'english' or 'neutral' for one UI string."""
    if CHINESE.search(text):
        return "translated"
    rest = CODE_LIKE.sub(" ", TECHNICAL.sub(" ", text))
    return "english" if ENGLISH_WORD.search(rest) else "neutral"


def coverage_report(page, name: str, data_texts: set[str] = frozenset()) -> Report:
    """The strings of the page as it is now; `data_texts` are record names seen on it (data)."""
    report = Report(pages=[name])
    for text in page.evaluate(COLLECT, DATA_SELECTORS):
        if text in data_texts:
            continue
        kind = classify(text)
        if kind == "translated":
            report.translated.add(text)
        elif kind == "english":
            report.english.setdefault(text, name)
    return report


def write_report(report: Report, name: str) -> Path:
    REPORT_DIR.mkdir(parents=True, exist_ok=True)
    path = REPORT_DIR / f"{name}.txt"
    path.write_text(report.summary() + "\n", encoding="utf-8")
    return path


def _catalog_msgids() -> set[str]:
    msgids: set[str] = set()
    for po in LOCALE_DIR.glob("*/LC_MESSAGES/*.po"):
        msgids |= {key.split("\x04")[-1] for key in read_po(po)}
    return msgids
