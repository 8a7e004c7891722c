//! Markdown to plain text, line by line: markup syntax goes, text and paragraph structure stay. A full CommonMark
//! parser is not needed for retrieval; what matters is that markup characters do not pollute words.

/// Strips Markdown syntax (headings, emphasis, links, images, code fences, list markers, block quotes, table
/// rules, inline HTML) and keeps the text, one paragraph per blank-line-separated block.
pub fn markdown_to_text(md: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut fence: Option<String> = None;
    for raw_line in md.lines() {
        let line = raw_line.trim_end();
        let trimmed = line.trim_start();
        if let Some(marker) = &fence {
            if trimmed.starts_with(marker.as_str())
                && trimmed
                    .trim_start_matches(marker.as_str())
                    .trim()
                    .is_empty()
            {
                fence = None;
                out.push(String::new());
            } else {
                out.push(line.to_string());
            }
            continue;
        }
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            let marker_char = trimmed.as_bytes()[0] as char;
            let marker: String = trimmed.chars().take_while(|c| *c == marker_char).collect();
            fence = Some(marker);
            out.push(String::new());
            continue;
        }
        if is_table_rule(trimmed) || is_link_definition(trimmed) {
            continue;
        }
        if is_rule(trimmed) {
            out.push(String::new());
            continue;
        }
        let mut content = trimmed;
        while let Some(rest) = content.strip_prefix('>') {
            content = rest.trim_start();
        }
        let heading = content.starts_with('#');
        if heading {
            let hashes = content.chars().take_while(|c| *c == '#').count();
            let after = &content[hashes..];
            if hashes <= 6 && (after.is_empty() || after.starts_with(' ')) {
                content = after.trim().trim_end_matches('#').trim_end();
            }
        }
        content = strip_list_marker(content);
        let text = if content.contains('|') && trimmed.starts_with('|') {
            content
                .trim_matches('|')
                .split('|')
                .map(|cell| inline(cell.trim()))
                .collect::<Vec<_>>()
                .join(" | ")
        } else {
            inline(content)
        };
        if heading {
            out.push(String::new());
            out.push(text);
            out.push(String::new());
        } else {
            out.push(text);
        }
    }
    crate::textbuf::tidy(&out.join("\n"))
}

fn is_rule(line: &str) -> bool {
    let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
    compact.len() >= 3
        && (compact.chars().all(|c| c == '-')
            || compact.chars().all(|c| c == '*')
            || compact.chars().all(|c| c == '_')
            || compact.chars().all(|c| c == '='))
}

fn is_table_rule(line: &str) -> bool {
    line.contains('-')
        && line.contains('|')
        && line
            .chars()
            .all(|c| matches!(c, '|' | '-' | ':' | ' ' | '\t'))
}

fn is_link_definition(line: &str) -> bool {
    line.starts_with('[') && line.contains("]:") && !line.starts_with("[^")
}

fn strip_list_marker(line: &str) -> &str {
    for marker in ["- [ ] ", "- [x] ", "* [ ] ", "* [x] ", "- ", "* ", "+ "] {
        if let Some(rest) = line.strip_prefix(marker) {
            return rest;
        }
    }
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    if (1..=9).contains(&digits) {
        let rest = &line[digits..];
        if let Some(rest) = rest.strip_prefix(". ").or_else(|| rest.strip_prefix(") ")) {
            return rest;
        }
    }
    line
}

/// Inline markup: images and links keep their text, code spans their content, emphasis markers and inline HTML
/// tags disappear, backslash escapes resolve.
fn inline(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut link_tail: Option<(usize, usize)> = None;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\\' if i + 1 < chars.len() && chars[i + 1].is_ascii_punctuation() => {
                out.push(chars[i + 1]);
                i += 2;
            }
            '!' if chars.get(i + 1) == Some(&'[') => i += 1,
            '[' if link_tail.is_none() && chars.get(i + 1) != Some(&'^') => {
                // [text](url) and [text][ref] keep only the text: the brackets and target are skipped when the
                // scan reaches the closing bracket (no recursion, so nested brackets cannot exhaust the stack).
                if let Some(close) = find_char(&chars, i + 1, ']') {
                    let mut next = close + 1;
                    let target_end = match chars.get(next) {
                        Some('(') => find_char(&chars, next + 1, ')'),
                        Some('[') => find_char(&chars, next + 1, ']'),
                        _ => None,
                    };
                    if let Some(end) = target_end {
                        next = end + 1;
                    }
                    link_tail = Some((close, next));
                } else {
                    out.push(c);
                }
                i += 1;
            }
            ']' if link_tail.is_some_and(|(close, _)| close == i) => {
                i = link_tail.take().map_or(i + 1, |(_, next)| next);
            }
            '`' => {
                let ticks = chars[i..].iter().take_while(|c| **c == '`').count();
                i += ticks;
            }
            '<' => {
                let next = chars.get(i + 1).copied().unwrap_or(' ');
                let end = find_char(&chars, i + 1, '>');
                match end {
                    Some(end) if next.is_ascii_alphabetic() || next == '/' => {
                        let inner: String = chars[i + 1..end].iter().collect();
                        // Autolinks keep their target; tags vanish.
                        if inner.contains("://") || inner.contains('@') && !inner.contains(' ') {
                            out.push_str(&inner);
                        }
                        i = end + 1;
                    }
                    _ => {
                        out.push(c);
                        i += 1;
                    }
                }
            }
            '*' | '_' | '~' => {
                let run = chars[i..].iter().take_while(|x| **x == c).count();
                let before = if i == 0 { None } else { Some(chars[i - 1]) };
                let after = chars.get(i + run).copied();
                let word = |x: Option<char>| x.is_some_and(|x| x.is_alphanumeric());
                let space = |x: Option<char>| x.is_none_or(char::is_whitespace);
                // Emphasis markers touch text on exactly one side; `snake_case` and `2 * 3` keep their characters.
                let intraword = word(before) && word(after);
                let spaced = space(before) && space(after);
                let is_markup = !(spaced || intraword && c == '_') && (c != '~' || run >= 2);
                if !is_markup {
                    for _ in 0..run {
                        out.push(c);
                    }
                }
                i += run;
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    crate::html::decode_entities(&out).into_owned()
}

fn find_char(chars: &[char], from: usize, wanted: char) -> Option<usize> {
    chars
        .get(from..)?
        .iter()
        .position(|c| *c == wanted)
        .map(|p| p + from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_brackets_do_not_recurse() {
        let md = "[".repeat(100_000) + "x" + &"]".repeat(100_000);
        assert!(markdown_to_text(&md).contains('x'));
    }

    #[test]
    fn markup_is_stripped_and_paragraphs_kept() {
        let md = "# Title #\n\nSome *emphasis*, __strong__ and `code` with a [link](http://x.y \"t\").\n\
            ![diagram](img.png) snake_case_name and 2 * 3\n\n> quoted\n> text\n\n- item one\n1. item two\n\n\
            | a | b |\n|---|:-:|\n| 1 | 2 |\n\n```rust\nlet x = *y;\n```\n\nSetext\n======\n\n[ref]: http://x\n<b>bold</b> &amp; <https://e.org>";
        assert_eq!(
            markdown_to_text(md),
            "Title\n\nSome emphasis, strong and code with a link.\ndiagram snake_case_name and 2 * 3\n\nquoted\ntext\n\n\
             item one\nitem two\n\na | b\n1 | 2\n\nlet x = *y;\n\nSetext\n\nbold & https://e.org"
        );
    }
}
