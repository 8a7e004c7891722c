//! Office Open XML: docx, xlsx, pptx. Parts are located through the package relationships where the order matters
//! (sheets, slides), with conventional part names as the fallback for packages with damaged relationships.

use crate::archive::{resolve_target, Archive};
use crate::textbuf::TextBuilder;
use crate::xml::{attr, open_name, qualified_attr, walk, Node};
use crate::{ExtractError, Format, Limits, Section};
use std::collections::HashSet;

struct Relationship {
    id: String,
    kind: String,
    target: String,
}

fn folder_of(part: &str) -> &str {
    part.rsplit_once('/').map_or("", |(dir, _)| dir)
}

fn rels_path(part: &str) -> String {
    match part.rsplit_once('/') {
        Some((dir, file)) => format!("{dir}/_rels/{file}.rels"),
        None => format!("_rels/{part}.rels"),
    }
}

/// The relationships of `part`, with targets resolved to archive paths (external targets are dropped).
fn relationships(
    archive: &mut Archive<'_>,
    part: &str,
    format: Format,
    limits: &Limits,
) -> Result<Vec<Relationship>, ExtractError> {
    let Some(xml) = archive.read_text(&rels_path(part))? else {
        return Ok(Vec::new());
    };
    let mut rels = Vec::new();
    walk(&xml, limits.max_xml_depth, format, |node| {
        if let Node::Open(element) = node {
            if open_name(element) == "Relationship"
                && attr(element, "TargetMode").as_deref() != Some("External")
            {
                if let (Some(id), Some(kind), Some(target)) = (
                    attr(element, "Id"),
                    attr(element, "Type"),
                    attr(element, "Target"),
                ) {
                    rels.push(Relationship {
                        id,
                        kind,
                        target: resolve_target(folder_of(part), &target),
                    });
                }
            }
        }
    })?;
    Ok(rels)
}

/// The package's main part (`officeDocument` relationship of the root), or the conventional name.
fn main_part(
    archive: &mut Archive<'_>,
    format: Format,
    conventional: &str,
    limits: &Limits,
) -> Result<String, ExtractError> {
    let root = relationships(archive, "", format, limits)?;
    let declared = root
        .into_iter()
        .find(|r| r.kind.ends_with("/officeDocument"))
        .map(|r| r.target)
        .filter(|t| archive.find(t).is_some());
    Ok(declared.unwrap_or_else(|| conventional.to_string()))
}

/// Parts whose file name is `prefix` + a number + `.xml`, ordered by that number.
fn numbered_parts(archive: &Archive<'_>, prefix: &str) -> Vec<String> {
    let mut parts: Vec<(u64, String)> = archive
        .names()
        .iter()
        .filter_map(|name| {
            let number = name.strip_prefix(prefix)?.strip_suffix(".xml")?;
            Some((number.parse().ok()?, name.clone()))
        })
        .collect();
    parts.sort();
    parts.into_iter().map(|(_, name)| name).collect()
}

pub(crate) fn docx(data: &[u8], limits: &Limits) -> Result<Vec<Section>, ExtractError> {
    let format = Format::Docx;
    let mut archive = Archive::open(data, format, limits)?;
    let main = main_part(&mut archive, format, "word/document.xml", limits)?;
    let body = archive
        .read_text(&main)?
        .ok_or_else(|| ExtractError::corrupt(format, format!("missing main part {main}")))?;
    let mut parts = vec![word_text(&body, limits)?];
    let folder = folder_of(&main).to_string();
    for notes in ["footnotes.xml", "endnotes.xml"] {
        if let Some(xml) = archive.read_text(&format!("{folder}/{notes}"))? {
            parts.push(word_text(&xml, limits)?);
        }
    }
    // Headers and footers usually repeat per section; each distinct text is kept once.
    for kind in ["header", "footer"] {
        for part in numbered_parts(&archive, &format!("{folder}/{kind}")) {
            if let Some(xml) = archive.read_text(&part)? {
                let text = word_text(&xml, limits)?;
                if !parts.contains(&text) {
                    parts.push(text);
                }
            }
        }
    }
    parts.retain(|p| !p.trim().is_empty());
    Ok(vec![Section {
        locator: None,
        text: parts.join("\n\n"),
    }])
}

/// Text of a WordprocessingML part: paragraphs as paragraphs, tables as one line per row with ` | ` between
/// cells. Only `w:t` content counts, which leaves out field codes (`w:instrText`) and deleted text (`w:delText`).
fn word_text(xml: &str, limits: &Limits) -> Result<String, ExtractError> {
    let mut out = TextBuilder::new();
    let mut in_text = false;
    let mut run_depth = 0usize;
    let mut table_depth = 0usize;
    // Alternate-content fallbacks repeat the preferred choice's text.
    let mut fallback_depth = 0usize;
    walk(xml, limits.max_xml_depth, Format::Docx, |node| match node {
        Node::Open(element) => match open_name(element) {
            "Fallback" => fallback_depth += 1,
            "t" => in_text = true,
            "r" => run_depth += 1,
            "tab" | "ptab" if run_depth > 0 => out.space(),
            "br" | "cr" if run_depth > 0 => out.line_break(),
            "noBreakHyphen" if run_depth > 0 && fallback_depth == 0 => out.push_text("-"),
            "tbl" => {
                table_depth += 1;
                out.paragraph_break();
            }
            "tc" => out.separator(" | "),
            _ => {}
        },
        Node::Close(name) => match name {
            "Fallback" => fallback_depth = fallback_depth.saturating_sub(1),
            "t" => in_text = false,
            "r" => run_depth = run_depth.saturating_sub(1),
            "p" if table_depth > 0 => out.space(),
            "p" => out.paragraph_break(),
            "tr" => out.line_break(),
            "tbl" => {
                table_depth = table_depth.saturating_sub(1);
                out.paragraph_break();
            }
            _ => {}
        },
        Node::Text(text) => {
            if in_text && fallback_depth == 0 {
                out.push_text(text);
            }
        }
    })?;
    Ok(out.finish())
}

pub(crate) fn xlsx(data: &[u8], limits: &Limits) -> Result<Vec<Section>, ExtractError> {
    let format = Format::Xlsx;
    let mut archive = Archive::open(data, format, limits)?;
    let workbook_part = main_part(&mut archive, format, "xl/workbook.xml", limits)?;
    let workbook = archive.read_text(&workbook_part)?.ok_or_else(|| {
        ExtractError::corrupt(format, format!("missing workbook part {workbook_part}"))
    })?;
    let rels = relationships(&mut archive, &workbook_part, format, limits)?;
    let folder = folder_of(&workbook_part).to_string();

    let shared_part = rels
        .iter()
        .find(|r| r.kind.ends_with("/sharedStrings"))
        .map(|r| r.target.clone())
        .unwrap_or_else(|| format!("{folder}/sharedStrings.xml"));
    let shared = match archive.read_text(&shared_part)? {
        Some(xml) => shared_strings(&xml, limits)?,
        None => Vec::new(),
    };

    let mut sheets: Vec<(String, String)> = Vec::new();
    let mut named = HashSet::new();
    walk(&workbook, limits.max_xml_depth, format, |node| {
        if let Node::Open(element) = node {
            if open_name(element) == "sheet" {
                let name = attr(element, "name").unwrap_or_default();
                let target = qualified_attr(element, "id")
                    .and_then(|id| rels.iter().find(|r| r.id == id))
                    .map(|r| r.target.clone());
                // A part is read once, however many sheets name it (see `pptx`).
                if let Some(target) = target.filter(|target| named.insert(target.clone())) {
                    sheets.push((name, target));
                }
            }
        }
    })?;
    if sheets.is_empty() {
        sheets = numbered_parts(&archive, &format!("{folder}/worksheets/sheet"))
            .into_iter()
            .enumerate()
            .map(|(i, part)| (format!("Sheet{}", i + 1), part))
            .collect();
    }
    let mut sections = Vec::new();
    for (name, part) in sheets {
        if let Some(xml) = archive.read_text(&part)? {
            sections.push(Section {
                // Excel keeps names to 31 characters; a hostile file's longer ones would weigh on every answer
                // citing the workbook (a document's labels are read whole for each cited chunk).
                locator: Some(format!(
                    "sheet \"{}\"",
                    name.chars().take(100).collect::<String>()
                )),
                text: sheet_text(&xml, &shared, limits)?,
            });
        }
    }
    Ok(sections)
}

fn shared_strings(xml: &str, limits: &Limits) -> Result<Vec<String>, ExtractError> {
    let mut strings = Vec::new();
    let mut current = String::new();
    let mut in_text = false;
    // Phonetic guides (rPh) repeat the reading of East Asian text, not content.
    let mut phonetic_depth = 0usize;
    walk(xml, limits.max_xml_depth, Format::Xlsx, |node| match node {
        Node::Open(element) => match open_name(element) {
            "si" => current.clear(),
            "t" => in_text = true,
            "rPh" => phonetic_depth += 1,
            _ => {}
        },
        Node::Close(name) => match name {
            "si" => strings.push(std::mem::take(&mut current)),
            "t" => in_text = false,
            "rPh" => phonetic_depth = phonetic_depth.saturating_sub(1),
            _ => {}
        },
        Node::Text(text) => {
            if in_text && phonetic_depth == 0 {
                current.push_str(text);
            }
        }
    })?;
    Ok(strings)
}

/// Zero-based column index of a cell reference such as `C12`.
fn column_index(reference: &str) -> Option<usize> {
    let letters = reference.bytes().take_while(u8::is_ascii_alphabetic);
    let mut index = 0usize;
    let mut count = 0;
    for letter in letters {
        count += 1;
        if count > 3 {
            return None;
        }
        index = index * 26 + usize::from(letter.to_ascii_uppercase() - b'A') + 1;
    }
    index.checked_sub(1)
}

/// Empty columns between two values are kept as tabs so rows stay aligned, up to this many.
const MAX_COLUMN_GAP: usize = 32;

/// Rows as lines, cells separated by tabs; shared-string, inline-string, boolean and numeric cells.
fn sheet_text(xml: &str, shared: &[String], limits: &Limits) -> Result<String, ExtractError> {
    let mut out = TextBuilder::new();
    let mut cell_type = String::new();
    let mut cell_column: Option<usize> = None;
    let mut value = String::new();
    let mut collecting = false;
    let mut next_column = 0usize;
    let mut row_has_value = false;
    walk(xml, limits.max_xml_depth, Format::Xlsx, |node| match node {
        Node::Open(element) => match open_name(element) {
            "row" => {
                next_column = 0;
                row_has_value = false;
            }
            "c" => {
                cell_type = attr(element, "t").unwrap_or_default();
                cell_column = attr(element, "r").as_deref().and_then(column_index);
                value.clear();
            }
            "v" | "t" => collecting = true,
            _ => {}
        },
        Node::Close(name) => match name {
            "v" | "t" => collecting = false,
            "c" => {
                // Borrowed, not copied: one shared string may be in every cell of the sheet.
                let text: std::borrow::Cow<'_, str> = match cell_type.as_str() {
                    "s" => value
                        .trim()
                        .parse::<usize>()
                        .ok()
                        .and_then(|i| shared.get(i))
                        .map(|shared| std::borrow::Cow::Borrowed(shared.as_str()))
                        .unwrap_or_default(),
                    "b" => match value.trim() {
                        "1" => "TRUE".into(),
                        "0" => "FALSE".into(),
                        other => other.to_string().into(),
                    },
                    _ => value.trim().to_string().into(),
                };
                let column = cell_column.unwrap_or(next_column).max(next_column);
                if !text.trim().is_empty() {
                    let gap = (column - next_column).min(MAX_COLUMN_GAP);
                    let tabs = gap + usize::from(row_has_value);
                    if tabs > 0 {
                        out.push_literal(&"\t".repeat(tabs));
                    }
                    out.push_text(&text);
                    row_has_value = true;
                    next_column = column + 1;
                }
            }
            "row" => out.line_break(),
            _ => {}
        },
        Node::Text(text) => {
            if collecting {
                value.push_str(text);
            }
        }
    })?;
    Ok(out.finish())
}

pub(crate) fn pptx(data: &[u8], limits: &Limits) -> Result<Vec<Section>, ExtractError> {
    let format = Format::Pptx;
    let mut archive = Archive::open(data, format, limits)?;
    let presentation_part = main_part(&mut archive, format, "ppt/presentation.xml", limits)?;
    let presentation = archive.read_text(&presentation_part)?.unwrap_or_default();
    let rels = relationships(&mut archive, &presentation_part, format, limits)?;
    let mut slides: Vec<String> = Vec::new();
    let mut named = HashSet::new();
    walk(&presentation, limits.max_xml_depth, format, |node| {
        if let Node::Open(element) = node {
            if open_name(element) == "sldId" {
                // A slide part is read once, however many entries name it: PowerPoint writes each once, and an
                // 18 kB file that named one 10 kB slide 6,300 times made 63 MB of text (red team 20).
                if let Some(rel) =
                    qualified_attr(element, "id").and_then(|id| rels.iter().find(|r| r.id == id))
                {
                    if named.insert(rel.target.clone()) {
                        slides.push(rel.target.clone());
                    }
                }
            }
        }
    })?;
    if slides.is_empty() {
        slides = numbered_parts(
            &archive,
            &format!("{}/slides/slide", folder_of(&presentation_part)),
        );
    }
    let mut sections = Vec::new();
    for (index, slide_part) in slides.iter().enumerate() {
        let Some(xml) = archive.read_text(slide_part)? else {
            continue;
        };
        let mut text = drawing_text(&xml, format, limits)?;
        let notes_part = relationships(&mut archive, slide_part, format, limits)?
            .into_iter()
            .find(|r| r.kind.ends_with("/notesSlide"))
            .map(|r| r.target);
        if let Some(notes_part) = notes_part {
            if let Some(notes_xml) = archive.read_text(&notes_part)? {
                let notes = drawing_text(&notes_xml, format, limits)?;
                if !notes.trim().is_empty() {
                    text.push_str("\n\nNotes: ");
                    text.push_str(&notes);
                }
            }
        }
        sections.push(Section {
            locator: Some(format!("slide {}", index + 1)),
            text,
        });
    }
    Ok(sections)
}

/// Text of DrawingML (slides, notes): a line per paragraph, a blank line between shapes, tables row by row.
/// Slide-number fields are skipped: they would add a stray number to every notes page.
fn drawing_text(xml: &str, format: Format, limits: &Limits) -> Result<String, ExtractError> {
    let mut out = TextBuilder::new();
    let mut in_text = false;
    let mut fallback_depth = 0usize;
    let mut table_depth = 0usize;
    let mut in_slide_number = false;
    walk(xml, limits.max_xml_depth, format, |node| match node {
        Node::Open(element) => match open_name(element) {
            "Fallback" => fallback_depth += 1,
            "t" => in_text = true,
            "br" => out.line_break(),
            "fld" => {
                in_slide_number =
                    attr(element, "type").is_some_and(|t| t.eq_ignore_ascii_case("slidenum"))
            }
            "tbl" => {
                table_depth += 1;
                out.paragraph_break();
            }
            "tc" => out.separator(" | "),
            _ => {}
        },
        Node::Close(name) => match name {
            "Fallback" => fallback_depth = fallback_depth.saturating_sub(1),
            "t" => in_text = false,
            "fld" => in_slide_number = false,
            "tbl" => {
                table_depth = table_depth.saturating_sub(1);
                out.paragraph_break();
            }
            // Paragraphs inside one table cell stay on the row's line.
            "p" if table_depth > 0 => out.space(),
            "txBody" if table_depth > 0 => {}
            "p" | "tr" => out.line_break(),
            "sp" | "txBody" | "graphicFrame" => out.paragraph_break(),
            _ => {}
        },
        Node::Text(text) => {
            if in_text && fallback_depth == 0 && !in_slide_number {
                out.push_text(text);
            }
        }
    })?;
    Ok(out.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_letters_map_to_indexes() {
        assert_eq!(column_index("A1"), Some(0));
        assert_eq!(column_index("Z9"), Some(25));
        assert_eq!(column_index("AA10"), Some(26));
        assert_eq!(column_index("XFD1"), Some(16383));
        assert_eq!(column_index("ABCD1"), None);
        assert_eq!(column_index("12"), None);
    }

    #[test]
    fn sheet_rows_keep_column_alignment() {
        let xml = r#"<worksheet><sheetData>
            <row r="1"><c r="A1" t="s"><v>0</v></c><c r="C1"><v>3.5</v></c></row>
            <row r="2"><c r="B2" t="b"><v>1</v></c><c r="C2" t="inlineStr"><is><t>inline</t></is></c><c r="D2"/></row>
            </sheetData></worksheet>"#;
        let text = sheet_text(xml, &["name".to_string()], &Limits::default()).unwrap();
        assert_eq!(text, "name\t\t3.5\n\tTRUE\tinline");
    }
}
