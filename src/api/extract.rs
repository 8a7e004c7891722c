//! Files in: `rag_extract_text()` and `rag_ingest_file()`. Extraction happens in the caller's session, before
//! anything is written, so a scan, an encrypted PDF or a zip bomb is an ERROR and leaves no row behind.
use crate::error::{RagError, SpiContext, UnwrapOrRaise};
use pgrx::prelude::*;
use pgrx::JsonB;
use rag_extract::{extract, Extracted, Limits};

fn limits() -> Limits {
    use crate::settings::*;
    Limits {
        max_input_bytes: MAX_FILE_SIZE_KB.get().max(1) as usize * 1024,
        max_decompressed_bytes: MAX_DECOMPRESSED_SIZE_KB.get().max(1) as usize * 1024,
        max_archive_entries: MAX_ARCHIVE_ENTRIES.get().max(1) as usize,
        max_xml_depth: MAX_XML_DEPTH.get().max(1) as usize,
        max_pdf_pages: MAX_PDF_PAGES.get().max(1) as usize,
        // The text becomes a document, which may be at most rag.max_document_size.
        max_text_bytes: MAX_DOCUMENT_SIZE_KB.get().max(1) as usize * 1024,
    }
}

thread_local! {
    // Set by this backend's last extraction thread when it ends. A backend runs its SQL on one thread.
    static LAST_EXTRACTION_DONE: std::cell::RefCell<Option<std::sync::Arc<std::sync::atomic::AtomicBool>>> =
        const { std::cell::RefCell::new(None) };
}

/// Extracts on a thread of its own while this backend keeps answering cancel requests and statement_timeout:
/// a large or hostile file is parsed for seconds, and the caller gets control back within one poll interval.
/// A cancelled extraction's thread runs to its end (bounded by the size limits) and its result is dropped; the
/// backend's next extraction waits for it (interruptibly) before starting, so one backend never has more than
/// one: cancelled calls in a loop piled up threads, each holding its file's memory, until the server's
/// allocator failed (found by a red-team run).
fn extract_interruptibly(data: &[u8], filename: Option<&str>) -> Result<Extracted, RagError> {
    const POLL: std::time::Duration = std::time::Duration::from_millis(20);
    let previous = LAST_EXTRACTION_DONE.with(|last| last.borrow().clone());
    if let Some(previous) = previous {
        while !previous.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::sleep(POLL);
            pgrx::check_for_interrupts!();
        }
    }
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done_by_thread = std::sync::Arc::clone(&done);
    let owned = data.to_vec();
    let name = filename.map(str::to_owned);
    let limits = limits();
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    let builder = std::thread::Builder::new()
        .name("rag-extract".into())
        .stack_size(16 * 1024 * 1024);
    rag_threads::spawn(builder, move || {
        let result = extract(&owned, name.as_deref(), &limits);
        drop(owned);
        // The caller may have been cancelled and gone; then nobody wants the result.
        let _ = sender.send(result);
        done_by_thread.store(true, std::sync::atomic::Ordering::Release);
    })
    .map_err(|error| RagError::Resources {
        message: format!("cannot start the extraction thread: {error}"),
        hint: "The server is out of threads or memory; try again.".to_string(),
    })?;
    LAST_EXTRACTION_DONE.with(|last| *last.borrow_mut() = Some(done));
    loop {
        match receiver.recv_timeout(POLL) {
            Ok(result) => {
                return result.map_err(|error| RagError::Extraction {
                    filename: filename.map(str::to_owned),
                    error,
                })
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                pgrx::check_for_interrupts!();
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(RagError::Internal(
                    "the extraction thread ended without a result".to_string(),
                ))
            }
        }
    }
}

pub fn extract_or_raise(data: &[u8], filename: Option<&str>) -> Extracted {
    extract_interruptibly(data, filename).unwrap_or_raise()
}

/// The text of a file (PDF, DOCX, XLSX, PPTX, ODT, ODS, ODP, HTML, Markdown, CSV, JSON, XML, YAML, TXT),
/// sections separated by blank lines.
#[pg_extern(immutable, parallel_safe)]
pub fn rag_extract_text(data: &[u8], filename: default!(Option<&str>, "NULL")) -> String {
    extract_or_raise(data, filename).text()
}

/// The parts of a file with what a citation would call them: `p. 3`, `slide 2`, `sheet "Q3"`.
#[pg_extern(immutable, parallel_safe)]
pub fn rag_extract_sections(
    data: &[u8],
    filename: default!(Option<&str>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(format, String),
        name!(locator, Option<String>),
        name!(text, String),
    ),
> {
    let extracted = extract_or_raise(data, filename);
    let format = extracted.format.to_string();
    TableIterator::new(
        extracted
            .sections
            .into_iter()
            .map(move |section| (format.clone(), section.locator, section.text)),
    )
}

/// What rag_ingest receives of an extracted file: its whole text as the body, or its parts (pages, slides,
/// sheets) with the labels they carry.
type BodyOrPages = (
    Option<String>,
    Option<Vec<String>>,
    Option<Vec<Option<String>>>,
);

/// Extracts a file and ingests its text; each page, slide or sheet becomes a page whose label citations use.
#[pg_extern(volatile, parallel_unsafe, security_definer)]
pub fn rag_ingest_file(
    collection: &str,
    filename: &str,
    data: &[u8],
    metadata: default!(Option<JsonB>, "'{}'"),
    title: default!(Option<&str>, "NULL"),
) -> i64 {
    let extracted = extract_or_raise(data, Some(filename));
    let format = extracted.format.to_string();
    let mut metadata = metadata
        .map(|JsonB(value)| value)
        .unwrap_or_else(|| serde_json::json!({}));
    if let Some(object) = metadata.as_object_mut() {
        object
            .entry("format")
            .or_insert_with(|| serde_json::Value::String(format));
    }
    let title = title.unwrap_or(filename).to_string();
    let has_parts = extracted
        .sections
        .iter()
        .any(|section| section.locator.is_some());
    let (body, pages, labels): BodyOrPages = if has_parts {
        let labels = extracted
            .sections
            .iter()
            .map(|section| section.locator.clone())
            .collect();
        let pages = extracted
            .sections
            .into_iter()
            .map(|section| section.text)
            .collect();
        (None, Some(pages), Some(labels))
    } else {
        (Some(extracted.text()), None, None)
    };
    Spi::connect_mut(|client| {
        let rows = client.update(
            "SELECT rag_definer.rag_ingest($1, $2, $3, $4, $5, $6)",
            Some(1),
            &[
                collection.into(),
                title.into(),
                body.into(),
                JsonB(metadata).into(),
                pages.into(),
                filename.into(),
            ],
        )?;
        let id = rows.first().get_one::<i64>()?.unwrap_or_default();
        if labels.is_some() {
            client.update(
                "SELECT rag._set_page_labels($1, $2)",
                None,
                &[id.into(), labels.into()],
            )?;
        }
        Ok::<_, pgrx::spi::Error>(id)
    })
    .doing(|| format!("ingesting \"{filename}\""))
    .unwrap_or_raise()
}

/// Raises unless markup of `bytes` may be converted: at most `rag.max_file_size`, what an HTML or Markdown file
/// may be. Conversion holds a few copies of its input (a 300 MB Markdown text peaked at 1.8 GB, and 510 MB
/// aborted the server when an allocation failed), so it is bounded before it starts, like a file's.
fn require_convertible(bytes: usize, what: &str) {
    let limit = crate::settings::MAX_FILE_SIZE_KB.get().max(1) as usize * 1024;
    if bytes > limit {
        crate::error::RagError::Extraction {
            filename: None,
            error: rag_extract::ExtractError::TooLarge {
                what: format!("bytes of {what} to convert"),
                limit,
            },
        }
        .raise();
    }
}

/// Visible text of an HTML fragment or page: scripts and styles dropped, blocks kept as paragraphs,
/// entities decoded. The same code reads HTML files and the HTML bodies of watched CMS tables.
#[pg_extern(immutable, parallel_safe, strict)]
pub fn rag_html_to_text(html: &str) -> String {
    require_convertible(html.len(), "HTML");
    rag_extract::html_to_text(html)
}

/// Markdown as plain text with its paragraph structure.
#[pg_extern(immutable, parallel_safe, strict)]
pub fn rag_markdown_to_text(markdown: &str) -> String {
    require_convertible(markdown.len(), "Markdown");
    rag_extract::markdown_to_text(markdown)
}

#[pg_schema]
pub mod rag {
    use pgrx::prelude::*;

    /// Text in the given format ('text', 'html', 'markdown') as plain text for chunking.
    #[pg_extern(immutable, parallel_safe, name = "_to_text")]
    pub fn to_text(text: Option<&str>, format: &str) -> Option<String> {
        let text = text?;
        Some(match format {
            "html" => {
                super::require_convertible(text.len(), "HTML");
                rag_extract::html_to_text(text)
            }
            "markdown" => {
                super::require_convertible(text.len(), "Markdown");
                rag_extract::markdown_to_text(text)
            }
            _ => text.to_string(),
        })
    }
}
