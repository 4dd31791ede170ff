// The pages' words in the page's language. Owns: reading Django's JavaScript catalog (the
// classic script /jsi18n/ that base.html loads before every module, so it is ready when a
// module's top level runs: constants may call gettext), and filling named values into a
// translated sentence. Strings are written in English in the code, wrapped in gettext("...")
// (or ngettext) so `make messages` finds them (locale/*/LC_MESSAGES/djangojs.po).
// Must not know: any page.

const catalog = globalThis.django;

/** The sentence in the page's language (itself when the catalog has no translation). */
export function gettext(msgid) {
  return catalog ? catalog.gettext(msgid) : msgid;
}

/** The singular or plural form for `count`, in the page's language (Chinese has one form). */
export function ngettext(singular, plural, count) {
  return catalog ? catalog.ngettext(singular, plural, count) : count === 1 ? singular : plural;
}

/** A short word whose meaning depends on where it stands: `context` tells translators which. */
export function pgettext(context, msgid) {
  return catalog ? catalog.pgettext(context, msgid) : msgid;
}

/** Named values into a translated sentence (as Django's interpolate(..., true)):
 * interpolate(gettext("%(n)s tokens"), {n: 3}) -> "3 tokens". */
export function interpolate(template, values) {
  return template.replace(/%\((\w+)\)s/g, (match, name) => (name in values ? String(values[name]) : match));
}

/** The page's language code as Django activated it: "en" or "zh-hans". */
export const language = document.documentElement.lang || "en";
