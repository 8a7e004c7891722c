//! A tolerant, flat HTML scanner. It never builds a tree and never recurses, so no markup can exhaust the stack;
//! it only needs to know which elements are invisible, which are blocks, and how entities decode.

use crate::textbuf::TextBuilder;

/// Elements whose content is never shown.
const HIDDEN: &[&str] = &[
    "script", "style", "template", "noscript", "svg", "math", "iframe", "object", "title",
];

/// Elements that start on a new paragraph.
const BLOCKS: &[&str] = &[
    "address",
    "article",
    "aside",
    "blockquote",
    "caption",
    "dd",
    "details",
    "dialog",
    "div",
    "dl",
    "dt",
    "fieldset",
    "figcaption",
    "figure",
    "footer",
    "form",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "header",
    "hgroup",
    "hr",
    "li",
    "main",
    "nav",
    "ol",
    "p",
    "pre",
    "section",
    "summary",
    "table",
    "ul",
    "body",
    "html",
];

/// Elements that may appear in `<head>`; any other element ends it (as browsers do when `</head>` is missing).
const HEAD_CONTENT: &[&str] = &[
    "title", "meta", "link", "base", "script", "style", "noscript", "template", "head",
];

/// Visible text of an HTML document or fragment: block elements become paragraph breaks (blank lines), `<br>` and
/// table rows become line breaks, table cells are separated by ` | `, entities are decoded, script, style,
/// template and head content are dropped, and whitespace is collapsed (except inside `<pre>`).
pub fn html_to_text(html: &str) -> String {
    let bytes = html.as_bytes();
    let mut out = TextBuilder::new();
    let mut pos = 0;
    let mut in_head = false;
    let mut pre_depth = 0usize;
    while pos < bytes.len() {
        let Some(offset) = bytes[pos..].iter().position(|&b| b == b'<') else {
            emit_text(&mut out, &html[pos..], pre_depth > 0, in_head);
            break;
        };
        let lt = pos + offset;
        emit_text(&mut out, &html[pos..lt], pre_depth > 0, in_head);
        let rest = &bytes[lt..];
        if rest.starts_with(b"<!--") {
            pos = find(bytes, lt + 4, b"-->").map_or(bytes.len(), |end| end + 3);
            continue;
        }
        if rest.starts_with(b"<!") || rest.starts_with(b"<?") {
            pos = find(bytes, lt + 2, b">").map_or(bytes.len(), |end| end + 1);
            continue;
        }
        let closing = rest.get(1) == Some(&b'/');
        let name_start = lt + 1 + usize::from(closing);
        let name_len = bytes[name_start..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || **b == b'-')
            .count();
        if name_len == 0 || !bytes[name_start].is_ascii_alphabetic() {
            // A lone '<' in text, as browsers treat it.
            emit_text(&mut out, "<", pre_depth > 0, in_head);
            pos = lt + 1;
            continue;
        }
        let name = html[name_start..name_start + name_len].to_ascii_lowercase();
        let tag_end = end_of_tag(bytes, name_start + name_len);
        pos = tag_end;

        if !closing && HIDDEN.contains(&name.as_str()) {
            pos = skip_raw_text(bytes, tag_end, &name);
            continue;
        }
        match (closing, name.as_str()) {
            (false, "head") => in_head = true,
            (true, "head") => in_head = false,
            (false, n) if in_head && !HEAD_CONTENT.contains(&n) => in_head = false,
            _ => {}
        }
        match name.as_str() {
            "br" => out.line_break(),
            "tr" => out.line_break(),
            "td" | "th" if !closing => out.separator(" | "),
            "pre" => {
                if closing {
                    pre_depth = pre_depth.saturating_sub(1);
                } else {
                    pre_depth += 1;
                }
                out.paragraph_break();
            }
            "img" | "input" | "wbr" => out.space(),
            n if BLOCKS.contains(&n) => out.paragraph_break(),
            _ => {}
        }
    }
    out.finish()
}

fn emit_text(out: &mut TextBuilder, raw: &str, preformatted: bool, in_head: bool) {
    if raw.is_empty() || in_head {
        return;
    }
    let decoded = decode_entities(raw);
    if preformatted {
        out.push_preformatted(&decoded);
    } else {
        out.push_text(&decoded);
    }
}

fn find(haystack: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    if from > haystack.len() {
        return None;
    }
    haystack[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// Index just past the `>` ending a tag, skipping quoted attribute values (which may contain `>`).
fn end_of_tag(bytes: &[u8], mut pos: usize) -> usize {
    let mut quote: Option<u8> = None;
    while pos < bytes.len() {
        let b = bytes[pos];
        match quote {
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if b == b'"' || b == b'\'' => quote = Some(b),
            None if b == b'>' => return pos + 1,
            None => {}
        }
        pos += 1;
    }
    bytes.len()
}

/// Index just past `</name ...>` (ASCII case-insensitive), or the end of input when it never closes.
fn skip_raw_text(bytes: &[u8], from: usize, name: &str) -> usize {
    let mut pos = from;
    while let Some(lt) = find(bytes, pos, b"</") {
        let candidate = &bytes[lt + 2..];
        if candidate.len() >= name.len()
            && candidate[..name.len()].eq_ignore_ascii_case(name.as_bytes())
            && !candidate
                .get(name.len())
                .is_some_and(|b| b.is_ascii_alphanumeric())
        {
            return end_of_tag(bytes, lt + 2 + name.len());
        }
        pos = lt + 2;
    }
    bytes.len()
}

/// Decodes numeric character references and the named entities that occur in practice; unknown names stay as
/// written, as browsers do.
pub(crate) fn decode_entities(raw: &str) -> std::borrow::Cow<'_, str> {
    if !raw.contains('&') {
        return std::borrow::Cow::Borrowed(raw);
    }
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let body_len = rest[1..]
            .bytes()
            .take(32)
            .take_while(|b| b.is_ascii_alphanumeric() || *b == b'#')
            .count();
        let body = &rest[1..1 + body_len];
        let decoded = if let Some(number) = body.strip_prefix('#') {
            let value = match number.strip_prefix(['x', 'X']) {
                Some(hex) => u32::from_str_radix(hex, 16).ok(),
                None => number.parse::<u32>().ok(),
            };
            value.map(|v| {
                char::from_u32(v)
                    .filter(|c| *c != '\0')
                    .unwrap_or('\u{FFFD}')
            })
        } else {
            named_entity(body)
        };
        match decoded {
            Some(c) => {
                // Soft hyphens and zero-width joiners are invisible; dropping them keeps words searchable.
                if c != '\u{200B}' {
                    out.push(c);
                }
                let consumed = 1 + body_len + usize::from(rest[1 + body_len..].starts_with(';'));
                rest = &rest[consumed..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

fn named_entity(name: &str) -> Option<char> {
    Some(match name {
        "amp" | "AMP" => '&',
        "lt" | "LT" => '<',
        "gt" | "GT" => '>',
        "quot" | "QUOT" => '"',
        "apos" => '\'',
        "nbsp" => ' ',
        "ensp" | "emsp" | "thinsp" => ' ',
        "shy" | "zwnj" | "zwj" | "lrm" | "rlm" => '\u{200B}',
        "copy" => '©',
        "reg" => '®',
        "trade" => '™',
        "hellip" => '…',
        "mdash" => '—',
        "ndash" => '–',
        "minus" => '−',
        "lsquo" => '‘',
        "rsquo" => '’',
        "sbquo" => '‚',
        "ldquo" => '“',
        "rdquo" => '”',
        "bdquo" => '„',
        "laquo" => '«',
        "raquo" => '»',
        "lsaquo" => '‹',
        "rsaquo" => '›',
        "bull" => '•',
        "middot" => '·',
        "deg" => '°',
        "plusmn" => '±',
        "times" => '×',
        "divide" => '÷',
        "frac12" => '½',
        "frac14" => '¼',
        "frac34" => '¾',
        "sect" => '§',
        "para" => '¶',
        "euro" => '€',
        "pound" => '£',
        "yen" => '¥',
        "cent" => '¢',
        "iexcl" => '¡',
        "iquest" => '¿',
        "micro" => 'µ',
        "dagger" => '†',
        "Dagger" => '‡',
        "permil" => '‰',
        "larr" => '←',
        "rarr" => '→',
        "uarr" => '↑',
        "darr" => '↓',
        "harr" => '↔',
        "szlig" => 'ß',
        "auml" => 'ä',
        "ouml" => 'ö',
        "uuml" => 'ü',
        "Auml" => 'Ä',
        "Ouml" => 'Ö',
        "Uuml" => 'Ü',
        "euml" => 'ë',
        "iuml" => 'ï',
        "yuml" => 'ÿ',
        "aacute" => 'á',
        "eacute" => 'é',
        "iacute" => 'í',
        "oacute" => 'ó',
        "uacute" => 'ú',
        "Aacute" => 'Á',
        "Eacute" => 'É',
        "Iacute" => 'Í',
        "Oacute" => 'Ó',
        "Uacute" => 'Ú',
        "agrave" => 'à',
        "egrave" => 'è',
        "igrave" => 'ì',
        "ograve" => 'ò',
        "ugrave" => 'ù',
        "Agrave" => 'À',
        "Egrave" => 'È',
        "acirc" => 'â',
        "ecirc" => 'ê',
        "icirc" => 'î',
        "ocirc" => 'ô',
        "ucirc" => 'û',
        "atilde" => 'ã',
        "otilde" => 'õ',
        "ntilde" => 'ñ',
        "Ntilde" => 'Ñ',
        "ccedil" => 'ç',
        "Ccedil" => 'Ç',
        "aring" => 'å',
        "Aring" => 'Å',
        "aelig" => 'æ',
        "AElig" => 'Æ',
        "oslash" => 'ø',
        "Oslash" => 'Ø',
        "oelig" => 'œ',
        "OElig" => 'Œ',
        "alpha" => 'α',
        "beta" => 'β',
        "gamma" => 'γ',
        "delta" => 'δ',
        "pi" => 'π',
        "mu" => 'μ',
        "sigma" => 'σ',
        "omega" => 'ω',
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_become_paragraphs_and_hidden_content_is_dropped() {
        let html = "<!DOCTYPE html><html><head><title>T</title><style>p{color:red}</style>\
            <script>var x = '<p>no</p>';</script></head><body><h1>Title</h1><p>First  para<br>line two</p>\
            <div>Caf&eacute; &amp; bar&nbsp;&#x263A; &#169; &unknown;</div><template><p>hidden</p></template>\
            <!-- comment <p>x</p> --><table><tr><td>a</td><td>b</td></tr><tr><td>c</td><td>d</td></tr></table></body></html>";
        assert_eq!(
            html_to_text(html),
            "Title\n\nFirst para\nline two\n\nCafé & bar ☺ © &unknown;\n\na | b\nc | d"
        );
    }

    #[test]
    fn inline_markup_does_not_split_words_and_pre_keeps_lines() {
        assert_eq!(
            html_to_text("<p>Hel<b>lo</b> <i>world</i></p><pre>a  b\nc</pre>"),
            "Hello world\n\na b\nc"
        );
    }

    #[test]
    fn malformed_and_hostile_markup_is_handled() {
        assert_eq!(
            html_to_text("a < b and <3 <p class=\"x>y\">c"),
            "a < b and <3\n\nc"
        );
        assert_eq!(html_to_text("<script>never closed <p>x"), "");
        let deep = "<div>".repeat(200_000) + "deep" + &"</div>".repeat(200_000);
        assert_eq!(html_to_text(&deep), "deep");
        assert_eq!(
            html_to_text("text <head>no closing <p>body"),
            "text\n\nbody"
        );
    }
}
