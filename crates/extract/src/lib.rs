//! Text extraction for the `rag` extension: turns an uploaded file (PDF, Office Open XML, OpenDocument, HTML,
//! Markdown or plain text) into citable text sections.
//!
//! Everything here runs inside a PostgreSQL backend, so the library is built around three guarantees:
//!
//! * **No panic escapes** [`extract`]: each extractor runs under [`std::panic::catch_unwind`] and a panic in a
//!   dependency becomes [`ExtractError::Corrupt`].
//! * **No unbounded recursion**: XML is read with an explicit depth limit, HTML with a flat scanner, and PDFs are
//!   parsed on a dedicated thread with a large stack on top of lopdf's own nesting limits.
//! * **No unbounded allocation**: input size, archive entry count and decompressed bytes are capped by [`Limits`];
//!   archive members are read through a capped reader, never trusting the sizes an archive declares.
//!
//! The result keeps document structure that matters for citations: one [`Section`] per PDF page (`p. 12`), per slide
//! (`slide 3`) or per sheet (`sheet "Q3"`).

#![warn(missing_docs)]

mod archive;
mod detect;
mod html;
mod markdown;
mod odf;
mod ooxml;
mod pdf;
mod plain;
mod textbuf;
mod xml;

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub use html::html_to_text;
pub use markdown::markdown_to_text;

/// A document format this crate can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Format {
    /// Plain text (`.txt`, `.log` and anything textual without a more specific format).
    Text,
    /// Markdown (`.md`, `.markdown`); markup is stripped.
    Markdown,
    /// Comma- or tab-separated values, kept as text.
    Csv,
    /// JSON, kept as text.
    Json,
    /// XML; character data only, tags dropped.
    Xml,
    /// YAML, kept as text.
    Yaml,
    /// HTML; visible text only.
    Html,
    /// Word document (Office Open XML).
    Docx,
    /// Excel workbook (Office Open XML).
    Xlsx,
    /// PowerPoint presentation (Office Open XML).
    Pptx,
    /// OpenDocument text.
    Odt,
    /// OpenDocument spreadsheet.
    Ods,
    /// OpenDocument presentation.
    Odp,
    /// Portable Document Format.
    Pdf,
}

impl Format {
    /// The short lowercase name, which is also the usual file extension.
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Markdown => "markdown",
            Format::Csv => "csv",
            Format::Json => "json",
            Format::Xml => "xml",
            Format::Yaml => "yaml",
            Format::Html => "html",
            Format::Docx => "docx",
            Format::Xlsx => "xlsx",
            Format::Pptx => "pptx",
            Format::Odt => "odt",
            Format::Ods => "ods",
            Format::Odp => "odp",
            Format::Pdf => "pdf",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Resource limits applied while extracting; every hostile-input defence is expressed through one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted input, in bytes.
    pub max_input_bytes: usize,
    /// Largest total of decompressed bytes read from an archive or from PDF streams.
    pub max_decompressed_bytes: usize,
    /// Largest number of entries an archive (docx, xlsx, pptx, odt, ...) may list.
    pub max_archive_entries: usize,
    /// Deepest XML element nesting accepted.
    pub max_xml_depth: usize,
    /// Largest number of PDF pages extracted.
    pub max_pdf_pages: usize,
    /// Most bytes of text one extraction may produce: a small file can ask for far more text than it holds
    /// (a shared spreadsheet string in every cell, a font's map of one code to many characters).
    pub max_text_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_input_bytes: 64 * 1024 * 1024,
            max_decompressed_bytes: 256 * 1024 * 1024,
            max_archive_entries: 10_000,
            max_xml_depth: 256,
            max_pdf_pages: 5_000,
            max_text_bytes: 64 * 1024 * 1024,
        }
    }
}

/// One addressable part of a document: a PDF page, a slide, a sheet.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Section {
    /// What a citation shows for this part: `p. 12`, `slide 3`, `sheet "Q3"`; `None` for formats without parts.
    pub locator: Option<String>,
    /// The text of this part; paragraphs are separated by blank lines.
    pub text: String,
}

/// The text extracted from one document.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Extracted {
    /// The format the content was read as (detected from the bytes, not just the file name).
    pub format: Format,
    /// The document's parts in reading order; parts without text are left out.
    pub sections: Vec<Section>,
}

impl Extracted {
    /// All sections' text joined by a blank line.
    pub fn text(&self) -> String {
        let parts: Vec<&str> = self.sections.iter().map(|s| s.text.as_str()).collect();
        parts.join("\n\n")
    }
}

/// Why a document could not be turned into text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ExtractError {
    /// A PDF whose pages carry no text at all: a scan or images only.
    NoTextLayer,
    /// The document is password protected.
    Encrypted {
        /// The format of the protected document.
        format: Format,
    },
    /// The file is damaged or is not what it claims to be.
    Corrupt {
        /// The format the file was read as.
        format: Format,
        /// What went wrong, for the error message.
        detail: String,
    },
    /// A resource limit was reached.
    TooLarge {
        /// Which quantity exceeded its limit, e.g. `"input size in bytes"`.
        what: String,
        /// The limit that was exceeded.
        limit: usize,
    },
    /// The content is of a kind this crate does not read (images, legacy binary Office files, ...).
    UnsupportedFormat {
        /// A short name of what was found.
        name: String,
    },
    /// A text file in an encoding other than UTF-8 or BOM-marked UTF-16, or containing NUL bytes.
    Encoding {
        /// What is wrong with the bytes.
        detail: String,
    },
    /// XML nested deeper than [`Limits::max_xml_depth`], or a PDF content stream's dictionaries and arrays
    /// nested deeper than the PDF reader takes.
    TooDeep {
        /// The format whose XML (or PDF content) was too deep.
        format: Format,
        /// The depth limit.
        limit: usize,
    },
    /// The input has zero bytes.
    Empty,
    /// The document was read successfully but contains no text.
    NoText {
        /// The format of the document.
        format: Format,
    },
    /// The process could not get the memory or the thread the extraction needs (it runs under a memory bound).
    OutOfResources {
        /// What could not be had.
        detail: String,
    },
}

impl ExtractError {
    /// A short suggestion for the user on how to get past this error.
    pub fn hint(&self) -> &'static str {
        match self {
            ExtractError::NoTextLayer => {
                "the PDF looks scanned; run it through OCR (e.g. ocrmypdf) and ingest the result"
            }
            ExtractError::Encrypted { .. } => "remove the password protection and ingest the file again",
            ExtractError::Corrupt { .. } => "check that the file is complete and opens in its usual application",
            ExtractError::TooLarge { .. } => "split the document or raise the corresponding limit setting",
            ExtractError::UnsupportedFormat { .. } => {
                "convert the file to PDF, an Office Open XML or OpenDocument format, HTML or plain text"
            }
            ExtractError::Encoding { .. } => "re-save the file as UTF-8",
            ExtractError::TooDeep { .. } => "the file is nested unusually deeply; it may be malicious",
            ExtractError::OutOfResources { .. } => "the extraction had too little memory; try again, or split the file",
            ExtractError::Empty => "the file has no bytes; check that it was read or uploaded completely",
            ExtractError::NoText { .. } => {
                "the file holds no text to index; if its text is in pictures, run it through OCR and ingest the result"
            }
        }
    }

    fn corrupt(format: Format, detail: impl Into<String>) -> Self {
        ExtractError::Corrupt {
            format,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for ExtractError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtractError::NoTextLayer => {
                f.write_str("pdf has no text layer (scanned or image-only pages); it needs OCR")
            }
            ExtractError::Encrypted { format } => {
                write!(f, "{format} document is encrypted (password protected)")
            }
            ExtractError::Corrupt { format, detail } => {
                write!(f, "{format} document is corrupt: {detail}")
            }
            ExtractError::TooLarge { what, limit } => {
                write!(f, "document exceeds the limit on {what} ({limit})")
            }
            ExtractError::UnsupportedFormat { name } => {
                write!(f, "unsupported document format: {name}")
            }
            ExtractError::Encoding { detail } => {
                write!(f, "text file has an unsupported encoding: {detail}")
            }
            ExtractError::TooDeep {
                format: Format::Pdf,
                limit,
            } => write!(
                f,
                "pdf document nests dictionaries and arrays in a page's content deeper than {limit} levels"
            ),
            ExtractError::TooDeep { format, limit } => {
                write!(f, "{format} document nests XML deeper than {limit} levels")
            }
            ExtractError::Empty => f.write_str("document is empty (0 bytes)"),
            ExtractError::NoText { format } => write!(f, "{format} document contains no text"),
            ExtractError::OutOfResources { detail } => {
                write!(f, "not enough memory to extract the document: {detail}")
            }
        }
    }
}

impl std::error::Error for ExtractError {}

/// Determines the format from the content (magic bytes, the zip directory), using the file name only to choose
/// between textual formats or to name what a non-matching file claimed to be.
pub fn detect_format(data: &[u8], filename_hint: Option<&str>) -> Result<Format, ExtractError> {
    detect::detect(data, filename_hint, &Limits::default())
}

/// Extracts the text of a document, detecting its format from the content with `filename_hint` as a tie-breaker.
pub fn extract(
    data: &[u8],
    filename_hint: Option<&str>,
    limits: &Limits,
) -> Result<Extracted, ExtractError> {
    if data.len() > limits.max_input_bytes {
        return Err(ExtractError::TooLarge {
            what: "input size in bytes".into(),
            limit: limits.max_input_bytes,
        });
    }
    if data.is_empty() {
        return Err(ExtractError::Empty);
    }
    let format = catch_panic(Format::Text, || detect::detect(data, filename_hint, limits))?;
    textbuf::start_text_budget(limits.max_text_bytes);
    let sections = match format {
        Format::Pdf => pdf::extract(data, limits)?,
        _ => catch_panic(format, || extract_non_pdf(format, data, limits))?,
    };
    let over = textbuf::text_budget_exceeded()
        || sections
            .iter()
            .map(|section| section.text.len())
            .sum::<usize>()
            > limits.max_text_bytes;
    if over {
        return Err(ExtractError::TooLarge {
            what: "bytes of extracted text".into(),
            limit: limits.max_text_bytes,
        });
    }
    finish(format, sections)
}

fn extract_non_pdf(
    format: Format,
    data: &[u8],
    limits: &Limits,
) -> Result<Vec<Section>, ExtractError> {
    match format {
        Format::Text | Format::Csv | Format::Json | Format::Yaml => Ok(whole(plain::decode(data)?)),
        Format::Markdown => Ok(whole(markdown_to_text(&plain::decode(data)?))),
        Format::Html => Ok(whole(html_to_text(&plain::decode(data)?))),
        Format::Xml => Ok(whole(xml::xml_to_text(
            &plain::decode(data)?,
            limits.max_xml_depth,
        )?)),
        Format::Docx => ooxml::docx(data, limits),
        Format::Xlsx => ooxml::xlsx(data, limits),
        Format::Pptx => ooxml::pptx(data, limits),
        Format::Odt | Format::Ods | Format::Odp => odf::extract(format, data, limits),
        Format::Pdf => pdf::extract(data, limits),
    }
}

fn whole(text: String) -> Vec<Section> {
    vec![Section {
        locator: None,
        text,
    }]
}

/// Runs `f`, turning a panic into [`ExtractError::Corrupt`]: a panic would otherwise abort the SQL call with a
/// message about Rust internals instead of one about the file.
pub(crate) fn catch_panic<T>(
    format: Format,
    f: impl FnOnce() -> Result<T, ExtractError>,
) -> Result<T, ExtractError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown cause".to_string());
            Err(ExtractError::corrupt(
                format,
                format!("parser failure: {message}"),
            ))
        }
    }
}

/// Cleans every section (PostgreSQL text cannot hold NUL; stray control characters only hurt chunking) and drops
/// empty ones; a document left with no text is an error rather than an empty ingest.
fn finish(format: Format, sections: Vec<Section>) -> Result<Extracted, ExtractError> {
    let sections: Vec<Section> = sections
        .into_iter()
        .map(|s| Section {
            locator: s.locator,
            text: textbuf::tidy(&s.text),
        })
        .filter(|s| !s.text.is_empty())
        .collect();
    if sections.is_empty() {
        return Err(match format {
            Format::Pdf => ExtractError::NoTextLayer,
            _ => ExtractError::NoText { format },
        });
    }
    Ok(Extracted { format, sections })
}
