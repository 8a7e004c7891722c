//! Markdown to plain text, line by line: markup syntax goes, text and paragraph structure stay. A full CommonMark
//! parser is not needed for retrieval; what matters is that markup characters do not pollute words.

/// Strips Markdown syntax (headings, emphasis, links, images, code fences, list markers, block quotes, table
/// rules, inline HTML) and keeps the text, one paragraph per blank-line-separated block.
pub fn markdown_to_text(md: &str) -> String {
    // One buffer of lines rather than a String per line: sixty million short lines took 1.5 GB as Strings
    // (red team 22), about their own size as one buffer.
    let mut out = String::with_capacity(md.len());
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
                out.push('\n');
            } else {
                push_line(&mut out, line);
            }
            continue;
        }
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            let marker_char = trimmed.as_bytes()[0] as char;
            let marker: String = trimmed.chars().take_while(|c| *c == marker_char).collect();
            fence = Some(marker);
            out.push('\n');
            continue;
        }
        if is_table_rule(trimmed) || is_link_definition(trimmed) {
            continue;
        }
        if is_rule(trimmed) {
            out.push('\n');
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
            out.push('\n');
            push_line(&mut out, &text);
            out.push('\n');
        } else {
            push_line(&mut out, &text);
        }
    }
    crate::textbuf::tidy(&out)
}

fn push_line(out: &mut String, line: &str) {
    out.push_str(line);
    out.push('\n');
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
    inline_counting_reads(text).0
}

/// `inline`, and how many characters its look-aheads read (which the tests hold to a multiple of the length).
fn inline_counting_reads(text: &str) -> (String, usize) {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut link_tail: Option<(usize, usize)> = None;
    // Each '[' and '<' looks ahead for its closing character; remembering what each look found keeps a line of
    // unclosed openers linear ("[[[[…" was quadratic: 47 s for 200,000 of them, and no cancel could stop it).
    let mut close_bracket = NextChar::new(']');
    let mut close_paren = NextChar::new(')');
    let mut close_angle = NextChar::new('>');
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
                if let Some(close) = close_bracket.find(&chars, i + 1) {
                    let mut next = close + 1;
                    let target_end = match chars.get(next) {
                        Some('(') => close_paren.find(&chars, next + 1),
                        Some('[') => close_bracket.find(&chars, next + 1),
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
                let end = close_angle.find(&chars, i + 1);
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
    let reads = close_bracket.read + close_paren.read + close_angle.read;
    (crate::html::decode_entities(&out).into_owned(), reads)
}

/// The first `wanted` at or after a position, remembering the last answer: every position between the last
/// look's start and what it found (or the end, when it found none) has the same answer, so looks from
/// positions that only move forward read each character at most once.
struct NextChar {
    wanted: char,
    looked_from: usize,
    found: Option<usize>,
    looked: bool,
    read: usize,
}

impl NextChar {
    fn new(wanted: char) -> Self {
        NextChar {
            wanted,
            looked_from: 0,
            found: None,
            looked: false,
            read: 0,
        }
    }

    fn find(&mut self, chars: &[char], from: usize) -> Option<usize> {
        let known =
            self.looked && from >= self.looked_from && self.found.is_none_or(|found| from <= found);
        if !known {
            self.looked = true;
            self.looked_from = from;
            self.found = chars
                .get(from..)
                .and_then(|rest| rest.iter().position(|c| *c == self.wanted))
                .map(|p| p + from);
            self.read += self
                .found
                .map_or(chars.len().saturating_sub(from), |found| found + 1 - from);
        }
        self.found
    }
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
    fn unclosed_openers_are_read_a_bounded_number_of_times() {
        // Searching to the end of the line from every unclosed opener read n²/2 characters: 47 s for 200,000
        // "[" in a backend no cancel could stop. Counted, not timed: each look-ahead reads each character at most
        // once.
        for opener in ["[", "<a", "[x](", "[x][", "![", "<", "[](", "[a]<b"] {
            let line = opener.repeat(20_000) + "x";
            let length = line.chars().count();
            let (text, reads) = inline_counting_reads(&line);
            assert!(text.ends_with('x'), "{opener}");
            assert!(
                reads <= 3 * length,
                "{opener}: {reads} characters read for a line of {length}"
            );
        }
        assert!(markdown_to_text(&"[".repeat(200_000)).starts_with('['));
    }

    #[test]
    fn lookahead_memory_matches_a_fresh_search() {
        let samples = [
            "[a](b) [c][d] [e] <b>f</b> <x [g](h",
            "[[a]](b)) <<i>> [j]( [k][l [m]",
            "text [one](two) and [three] then <https://x.y/z> [four](five) <u>six</u> [",
            "] [ ] [ )( ][ <>< >",
        ];
        for sample in samples {
            let chars: Vec<char> = sample.chars().collect();
            for wanted in [']', ')', '>'] {
                let mut memo = NextChar::new(wanted);
                for from in 0..=chars.len() + 1 {
                    let fresh = chars
                        .get(from..)
                        .and_then(|rest| rest.iter().position(|c| *c == wanted))
                        .map(|p| p + from);
                    assert_eq!(memo.find(&chars, from), fresh, "{sample:?} {wanted} {from}");
                }
                // Out of order too: the memory is only used where it is right.
                for from in (0..=chars.len()).rev() {
                    let fresh = chars
                        .get(from..)
                        .and_then(|rest| rest.iter().position(|c| *c == wanted))
                        .map(|p| p + from);
                    assert_eq!(
                        memo.find(&chars, from),
                        fresh,
                        "{sample:?} {wanted} {from} backwards"
                    );
                }
            }
        }
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
