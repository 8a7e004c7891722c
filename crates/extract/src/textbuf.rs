//! Builds text from a stream of fragments and structural breaks, collapsing whitespace the way a renderer would.

thread_local! {
    // What is left of one extraction's text budget (`Limits::max_text_bytes`), on the thread that extracts:
    // every builder of the extraction spends from it. A few kilobytes of file can ask for gigabytes of text (a
    // shared string of a megabyte in 100,000 spreadsheet cells, a ToUnicode entry of 200 characters shown 20
    // million times), and an allocation that fails aborts the whole server the library runs in.
    static TEXT_LEFT: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
    static TEXT_OVER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Starts an extraction's text budget on this thread.
pub(crate) fn start_text_budget(bytes: usize) {
    TEXT_LEFT.with(|left| left.set(bytes));
    TEXT_OVER.with(|over| over.set(false));
}

/// Whether the extraction on this thread asked for more text than its budget.
pub(crate) fn text_budget_exceeded() -> bool {
    TEXT_OVER.with(std::cell::Cell::get)
}

/// Bytes of text the extraction on this thread may still produce.
pub(crate) fn text_left() -> usize {
    TEXT_LEFT.with(std::cell::Cell::get)
}

/// Spends `bytes` of the budget; once it is gone, spends nothing, records that and answers false.
pub(crate) fn spend_text(bytes: usize) -> bool {
    let left = text_left();
    if bytes > left {
        TEXT_LEFT.with(|cell| cell.set(0));
        TEXT_OVER.with(|over| over.set(true));
        false
    } else {
        TEXT_LEFT.with(|cell| cell.set(left - bytes));
        true
    }
}

/// Accumulates text; whitespace inside fragments collapses to one space, and breaks requested between fragments
/// become a newline (line) or a blank line (paragraph) only once real text follows, so markup that opens and
/// closes many empty blocks never produces runs of blank lines.
#[derive(Default)]
pub(crate) struct TextBuilder {
    out: String,
    pending_space: bool,
    pending_break: u8,
    pending_separator: Option<&'static str>,
}

impl TextBuilder {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Appends text whose whitespace is not significant.
    pub(crate) fn push_text(&mut self, text: &str) {
        if text_budget_exceeded() {
            return;
        }
        for c in text.chars() {
            if c.is_whitespace() {
                self.pending_space = true;
            } else {
                self.push_visible(c);
            }
        }
    }

    /// Appends text whose line breaks are significant (preformatted HTML, PDF lines).
    pub(crate) fn push_preformatted(&mut self, text: &str) {
        if text_budget_exceeded() {
            return;
        }
        for c in text.chars() {
            match c {
                '\n' => self.line_break(),
                c if c.is_whitespace() => self.pending_space = true,
                c => self.push_visible(c),
            }
        }
    }

    fn push_visible(&mut self, c: char) {
        let before: &str = if self.out.is_empty() {
            ""
        } else if self.pending_break >= 2 {
            "\n\n"
        } else if self.pending_break == 1 {
            "\n"
        } else if let Some(sep) = self.pending_separator {
            sep
        } else if self.pending_space {
            " "
        } else {
            ""
        };
        if !spend_text(before.len() + c.len_utf8()) {
            return;
        }
        self.out.push_str(before);
        self.pending_break = 0;
        self.pending_space = false;
        self.pending_separator = None;
        self.out.push(c);
    }

    /// Requests a space before the next text (between words that markup separates).
    pub(crate) fn space(&mut self) {
        self.pending_space = true;
    }

    pub(crate) fn line_break(&mut self) {
        self.pending_break = self.pending_break.max(1);
    }

    pub(crate) fn paragraph_break(&mut self) {
        self.pending_break = 2;
    }

    /// Requests a cell separator before the next text on the same line; dropped at a line start.
    pub(crate) fn separator(&mut self, sep: &'static str) {
        if self.pending_break == 0 && !self.out.is_empty() {
            self.pending_separator = Some(sep);
        }
    }

    /// Appends a literal string (tabs keeping spreadsheet columns aligned) exactly, after any pending break.
    pub(crate) fn push_literal(&mut self, literal: &str) {
        if literal.is_empty() || !spend_text(literal.len() + 2) {
            return;
        }
        if !self.out.is_empty() {
            if self.pending_break >= 2 {
                self.out.push_str("\n\n");
            } else if self.pending_break == 1 {
                self.out.push('\n');
            }
        }
        self.pending_break = 0;
        self.pending_space = false;
        self.pending_separator = None;
        self.out.push_str(literal);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    pub(crate) fn finish(self) -> String {
        self.out
    }
}

/// Final clean-up of any extractor's output: drops NUL and other control characters (PostgreSQL text cannot hold
/// NUL), trims trailing spaces on each line, and collapses runs of blank lines into one.
pub(crate) fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank_lines = 0usize;
    for line in text.split('\n') {
        let cleaned: String = line
            .chars()
            .filter(|c| *c == '\t' || !(c.is_control() || *c == '\u{feff}'))
            .collect();
        let cleaned = cleaned.trim_end();
        if cleaned.trim().is_empty() {
            blank_lines += 1;
            continue;
        }
        if !out.is_empty() {
            out.push_str(if blank_lines > 0 { "\n\n" } else { "\n" });
        }
        blank_lines = 0;
        out.push_str(cleaned);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_collapses_and_breaks_apply_only_before_text() {
        let mut b = TextBuilder::new();
        b.paragraph_break();
        b.push_text("  Hello \n  world ");
        b.paragraph_break();
        b.paragraph_break();
        b.push_text("Next");
        b.separator(" | ");
        b.push_text("cell");
        b.line_break();
        b.separator(" | ");
        b.push_text("row");
        assert_eq!(b.finish(), "Hello world\n\nNext | cell\nrow");
    }

    #[test]
    fn tidy_removes_nul_and_collapses_blank_lines() {
        assert_eq!(tidy("a\u{0}b  \n\n\n\n c\r\n"), "ab\n\n c");
    }
}
