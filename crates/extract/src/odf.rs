//! OpenDocument: odt (text, plus page headers and footers from styles.xml), ods (a section per sheet, named by
//! the sheet) and odp (a section per slide, with speaker notes).

use crate::archive::Archive;
use crate::textbuf::TextBuilder;
use crate::xml::{attr, open_name, walk, Node};
use crate::{ExtractError, Format, Limits, Section};

/// Empty cells between two values are kept as tabs so rows stay aligned, up to this many (ODF repeats an
/// empty cell up to the last column, 16384 times and more).
const MAX_COLUMN_GAP: usize = 32;

pub(crate) fn extract(
    format: Format,
    data: &[u8],
    limits: &Limits,
) -> Result<Vec<Section>, ExtractError> {
    let mut archive = Archive::open(data, format, limits)?;
    let content = archive
        .read_text("content.xml")?
        .ok_or_else(|| ExtractError::corrupt(format, "missing content.xml"))?;
    let mut walker = OdfWalker::new(format);
    walk(&content, limits.max_xml_depth, format, |node| {
        walker.visit(node)
    })?;
    let mut sections = walker.finish();
    if format == Format::Odt {
        if let Some(styles) = archive.read_text("styles.xml")? {
            let page_furniture = header_footer_text(&styles, limits)?;
            if let Some(body) = sections.first_mut() {
                if !page_furniture.is_empty() {
                    body.text.push_str("\n\n");
                    body.text.push_str(&page_furniture);
                }
            }
        }
    }
    Ok(sections)
}

/// Text of the master pages' headers and footers (styles.xml), each distinct text once.
fn header_footer_text(styles: &str, limits: &Limits) -> Result<String, ExtractError> {
    let mut parts: Vec<String> = Vec::new();
    let mut current: Option<TextBuilder> = None;
    let mut depth_in_part = 0usize;
    walk(
        styles,
        limits.max_xml_depth,
        Format::Odt,
        |node| match node {
            Node::Open(element) => {
                let name = open_name(element);
                if current.is_none()
                    && (name.starts_with("header") || name.starts_with("footer"))
                    && name != "header-style"
                    && name != "footer-style"
                {
                    current = Some(TextBuilder::new());
                    depth_in_part = 0;
                } else if current.is_some() {
                    depth_in_part += 1;
                    if matches!(name, "s" | "tab") {
                        if let Some(b) = current.as_mut() {
                            b.space();
                        }
                    }
                }
            }
            Node::Close(name) => {
                if let Some(builder) = current.as_mut() {
                    if depth_in_part == 0 {
                        let text = current.take().map(TextBuilder::finish).unwrap_or_default();
                        if !text.trim().is_empty() && !parts.contains(&text) {
                            parts.push(text);
                        }
                    } else {
                        depth_in_part -= 1;
                        if matches!(name, "p" | "h") {
                            builder.line_break();
                        }
                    }
                }
            }
            Node::Text(text) => {
                if let Some(builder) = current.as_mut() {
                    builder.push_text(text);
                }
            }
        },
    )?;
    Ok(parts.join("\n\n"))
}

struct OdfWalker {
    format: Format,
    sections: Vec<Section>,
    /// The text being built: the whole document (odt), the current sheet (ods) or slide (odp).
    body: TextBuilder,
    body_locator: Option<String>,
    notes: TextBuilder,
    in_notes: bool,
    /// Inside content that is not document text: deleted changes, note citations, comments.
    skip_depth: usize,
    table_depth: usize,
    slide_count: usize,
    cell: Option<String>,
    cell_repeat: usize,
    pending_gap: usize,
    row_has_value: bool,
}

impl OdfWalker {
    fn new(format: Format) -> Self {
        OdfWalker {
            format,
            sections: Vec::new(),
            body: TextBuilder::new(),
            body_locator: None,
            notes: TextBuilder::new(),
            in_notes: false,
            skip_depth: 0,
            table_depth: 0,
            slide_count: 0,
            cell: None,
            cell_repeat: 1,
            pending_gap: 0,
            row_has_value: false,
        }
    }

    fn target(&mut self) -> &mut TextBuilder {
        if self.in_notes {
            &mut self.notes
        } else {
            &mut self.body
        }
    }

    /// A cell of a spreadsheet collects its text separately so empty cells can be counted rather than printed.
    fn spreadsheet_cell(&self) -> bool {
        self.format == Format::Ods && self.table_depth == 1
    }

    fn flush_section(&mut self) {
        let body = std::mem::take(&mut self.body).finish();
        let notes = std::mem::take(&mut self.notes).finish();
        let mut text = body;
        if !notes.trim().is_empty() {
            text.push_str("\n\nNotes: ");
            text.push_str(&notes);
        }
        self.sections.push(Section {
            locator: self.body_locator.take(),
            text,
        });
    }

    fn visit(&mut self, node: Node<'_, '_>) {
        match node {
            Node::Open(element) => {
                let name = open_name(element);
                if self.skip_depth > 0 {
                    self.skip_depth += 1;
                    return;
                }
                match name {
                    "tracked-changes" | "note-citation" | "annotation" | "sequence-decls"
                    | "forms" => {
                        self.skip_depth = 1;
                    }
                    "page" if self.format == Format::Odp => {
                        self.slide_count += 1;
                        self.body_locator = Some(format!("slide {}", self.slide_count));
                    }
                    "notes" if self.format == Format::Odp => self.in_notes = true,
                    "table" => {
                        self.table_depth += 1;
                        if self.format == Format::Ods && self.table_depth == 1 {
                            let sheet = attr(element, "name")
                                .unwrap_or_else(|| format!("Sheet{}", self.sections.len() + 1));
                            self.body_locator = Some(format!("sheet \"{sheet}\""));
                        }
                        self.target().paragraph_break();
                    }
                    "table-row" => {
                        self.pending_gap = 0;
                        self.row_has_value = false;
                    }
                    "table-cell" | "covered-table-cell" => {
                        if self.spreadsheet_cell() {
                            self.cell = Some(String::new());
                            self.cell_repeat = attr(element, "number-columns-repeated")
                                .and_then(|n| n.parse::<usize>().ok())
                                .unwrap_or(1)
                                .clamp(1, MAX_COLUMN_GAP);
                        } else {
                            self.target().separator(" | ");
                        }
                    }
                    "s" | "tab" => match self.cell.as_mut() {
                        Some(cell) => cell.push(' '),
                        None => self.target().space(),
                    },
                    "line-break" => match self.cell.as_mut() {
                        Some(cell) => cell.push(' '),
                        None => self.target().line_break(),
                    },
                    "list-item" => self.target().line_break(),
                    _ => {}
                }
            }
            Node::Close(name) => {
                if self.skip_depth > 0 {
                    self.skip_depth -= 1;
                    return;
                }
                match name {
                    "page" if self.format == Format::Odp => self.flush_section(),
                    "notes" if self.format == Format::Odp => self.in_notes = false,
                    "table" => {
                        self.table_depth = self.table_depth.saturating_sub(1);
                        if self.format == Format::Ods && self.table_depth == 0 {
                            self.flush_section();
                        } else {
                            self.target().paragraph_break();
                        }
                    }
                    "table-cell" | "covered-table-cell" if self.spreadsheet_cell() => {
                        let cell = self.cell.take().unwrap_or_default();
                        let cell = cell.trim();
                        if cell.is_empty() {
                            self.pending_gap =
                                (self.pending_gap + self.cell_repeat).min(MAX_COLUMN_GAP);
                        } else {
                            let tabs = self.pending_gap + usize::from(self.row_has_value);
                            if tabs > 0 {
                                self.body.push_literal(&"\t".repeat(tabs));
                            }
                            self.body.push_text(cell);
                            self.row_has_value = true;
                            self.pending_gap = self.cell_repeat - 1;
                        }
                    }
                    "table-row" => self.target().line_break(),
                    "p" | "h" => {
                        if let Some(cell) = self.cell.as_mut() {
                            cell.push(' ');
                        } else if self.table_depth > 0 {
                            self.target().space();
                        } else if self.format == Format::Odp {
                            self.target().line_break();
                        } else {
                            self.target().paragraph_break();
                        }
                    }
                    "frame" | "list" => self.target().paragraph_break(),
                    _ => {}
                }
            }
            Node::Text(text) => {
                if self.skip_depth > 0 {
                    return;
                }
                match self.cell.as_mut() {
                    Some(cell) => cell.push_str(text),
                    None => self.target().push_text(text),
                }
            }
        }
    }

    fn finish(mut self) -> Vec<Section> {
        match self.format {
            Format::Odt => self.flush_section(),
            // Text outside any sheet or slide (rare) is not lost.
            _ if !self.body.is_empty() || !self.notes.is_empty() => self.flush_section(),
            _ => {}
        }
        self.sections
    }
}
