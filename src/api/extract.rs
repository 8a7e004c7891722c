//! Files in: `rag_extract_text()` and `rag_ingest_file()`. Extraction happens in the caller's session, before
//! anything is written, so a scan, an encrypted PDF or a zip bomb is an ERROR and leaves no row behind.
use crate::error::{RagError, SpiContext, UnwrapOrRaise};
use pgrx::prelude::*;
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

/// What a child extraction may use (`rag.extraction_memory`, `rag.extraction_cpu_time`), read before it starts.
#[derive(Clone, Copy)]
struct ChildBounds {
    /// Address space it may add to what it inherits from the backend.
    address_space_bytes: u64,
    cpu_seconds: u64,
}

impl ChildBounds {
    fn from_settings() -> ChildBounds {
        use crate::settings::{EXTRACTION_CPU_TIME_S, EXTRACTION_MEMORY_MB};
        ChildBounds {
            address_space_bytes: EXTRACTION_MEMORY_MB.get().max(1) as u64 * 1024 * 1024,
            cpu_seconds: EXTRACTION_CPU_TIME_S.get().max(1) as u64,
        }
    }

    /// Wall-clock time after which the child is ended whatever it does: a child that sleeps (a lock another
    /// thread of the backend held when it forked is never released in the child) uses no CPU time.
    fn wall_seconds(self) -> u64 {
        self.cpu_seconds * 2 + 10
    }

    fn memory(self) -> String {
        let mb = self.address_space_bytes >> 20;
        if mb.is_multiple_of(1024) {
            format!("{} GB", mb / 1024)
        } else {
            format!("{mb} MB")
        }
    }
}

const CHILD_BOUNDS_HINT: &str = "Split the file, or convert it to a simpler format such as plain text; a superuser may raise rag.extraction_memory or rag.extraction_cpu_time.";

/// Extracts in a child process of this backend (`fork`), under an address-space and a CPU-time limit of its
/// own, and reads its result from a pipe; at most rag.max_concurrent_extractions run at once in the cluster; this backend keeps answering cancel requests and statement_timeout
/// meanwhile, and a cancel kills the child. The PDF parser builds an object model that no input-size limit
/// bounds (a 3 KB object stream listing one big array 200 times, 12 MB of nested empty arrays: gigabytes), and
/// an allocation that fails inside the server aborts it and every other session with it; in the child it ends
/// the child alone, and the caller gets an ERROR (found by a red-team run, which aborted the server 8 times).
///
/// The child runs only the extraction crate's code on memory it inherited, touches nothing of PostgreSQL's
/// (no shared memory, no locks, no elog) and leaves with `_exit`, so none of the backend's exit handlers run
/// in it.
fn extract_interruptibly(data: &[u8], job: Job<'_>) -> Result<Extracted, RagError> {
    const POLL_MS: i32 = 20;
    let filename = match job {
        Job::File(filename) => filename,
        Job::Markup(rag_extract::Format::Markdown) => Some("the Markdown text"),
        Job::Markup(_) => Some("the HTML"),
    };
    let limits = limits();
    let bounds = ChildBounds::from_settings();
    // Registered before a slot is held: the exit callback gives the slot back too.
    reap_children_at_exit();
    // The rag worker takes no slot: it must not wait behind readers' files, which may hold every slot for
    // minutes, while it holds a watched row's document; its children are as many as rag.max_workers at most,
    // each under the same bounds.
    let _slot = (!crate::pg::is_rag_worker()).then(crate::api::extraction_slots::acquire);
    let out_of_resources = |what: &str| RagError::Resources {
        message: format!(
            "cannot start the extraction: {what}: {}",
            std::io::Error::last_os_error()
        ),
        hint: "The server is out of processes or memory; try again.".to_string(),
    };
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(out_of_resources("pipe"));
    }
    let (read_fd, write_fd) = (fds[0], fds[1]);
    // SAFETY: getpid never fails.
    let parent = unsafe { libc::getpid() };
    // SAFETY: fork duplicates this process; the child runs `extract_in_child`, which never returns.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        // SAFETY: closing the two descriptors just made.
        unsafe {
            libc::close(read_fd);
            libc::close(write_fd);
        }
        return Err(out_of_resources("fork"));
    }
    if pid == 0 {
        // SAFETY: in the child; the read end is the parent's.
        unsafe { libc::close(read_fd) };
        extract_in_child(parent, write_fd, data, job, &limits, bounds);
    }
    RUNNING_CHILD.store(pid, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: the write end is the child's.
    unsafe { libc::close(write_fd) };
    let child = Child {
        pid,
        fd: read_fd,
        reaped: false,
    };
    // JSON of the text: escapes at most double it (quotes, backslashes), and a control character becomes six
    // bytes (\u00XX). A file's text is at most max_text_bytes; a converted text at most its input.
    let most = match job {
        Job::File(_) => limits.max_text_bytes.saturating_mul(2),
        Job::Markup(_) => data.len().saturating_mul(6),
    }
    .saturating_add(1024 * 1024);
    let mut reply = Vec::new();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let mut poll = libc::pollfd {
            fd: child.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one descriptor of ours, with a timeout.
        let ready = unsafe { libc::poll(&mut poll, 1, POLL_MS) };
        if ready == 0
            || (ready < 0
                && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted)
        {
            // A cancel or statement_timeout raises here; the child's guard kills and reaps it.
            pgrx::check_for_interrupts!();
            // The rag worker's SIGTERM (shutdown, a DROP DATABASE of its database) only sets the flag its main
            // loop reads between steps: without this it waited for the child, up to its wall-clock bound.
            if crate::pg::is_rag_worker() && crate::pg::shutdown_requested() {
                return Err(RagError::Resources {
                    message: format!(
                        "the extraction of {} was stopped: the worker is shutting down",
                        filename.unwrap_or("the file")
                    ),
                    hint: "The server was shutting down, or a command needed the database to itself; write the row again (or queue the document again) if it stays failed.".to_string(),
                });
            }
            continue;
        }
        // SAFETY: reading into a buffer of ours, at most its length.
        let read = unsafe { libc::read(child.fd, buffer.as_mut_ptr().cast(), buffer.len()) };
        if read < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if read == 0 {
            break;
        }
        reply.extend_from_slice(&buffer[..read as usize]);
        if reply.len() > most {
            // Killed before waiting: it may be blocked writing the rest to a full pipe.
            // SAFETY: our own child.
            unsafe { libc::kill(child.pid, libc::SIGKILL) };
            break;
        }
    }
    let status = child.wait();
    // A cancel that came while the child ran (PostgreSQL signals the backend's whole process group, so the
    // child may have died of it) is reported as the cancel, not as the child's end.
    pgrx::check_for_interrupts!();
    if reply.len() > most {
        return Err(RagError::Extraction {
            filename: filename.map(str::to_owned),
            error: rag_extract::ExtractError::TooLarge {
                what: "bytes of extracted text and section names".into(),
                limit: limits.max_text_bytes,
            },
        });
    }
    match serde_json::from_slice::<Result<Extracted, rag_extract::ExtractError>>(&reply) {
        Ok(Err(rag_extract::ExtractError::OutOfResources { detail })) => Err(RagError::Resources {
            message: format!(
                "\"{}\" could not be extracted within {} of memory: {detail}",
                filename.unwrap_or("the file"),
                bounds.memory()
            ),
            hint: CHILD_BOUNDS_HINT.to_string(),
        }),
        Ok(result) => result.map_err(|error| RagError::Extraction {
            filename: filename.map(str::to_owned),
            error,
        }),
        Err(_) => {
            let why = match status {
                Some(libc::SIGXCPU) => {
                    format!("it needed more than {} s of CPU", bounds.cpu_seconds)
                }
                Some(libc::SIGALRM) => {
                    format!("it ran longer than {} s", bounds.wall_seconds())
                }
                Some(libc::SIGKILL) => {
                    "it was killed (out of CPU time, or the system out of memory)".to_string()
                }
                Some(signal) => format!(
                    "it needed more than {} of memory (the extraction ended on signal {signal})",
                    bounds.memory()
                ),
                None => "the extraction ended without a result".to_string(),
            };
            Err(RagError::Resources {
                message: format!(
                    "\"{}\" could not be extracted: {why}",
                    filename.unwrap_or("the file")
                ),
                hint: CHILD_BOUNDS_HINT.to_string(),
            })
        }
    }
}

/// The child extraction of this backend running now (0: none), for the exit callback.
static RUNNING_CHILD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
static EXIT_CALLBACK: std::sync::Once = std::sync::Once::new();

/// A backend that ends with FATAL (a lost client, pg_terminate_backend, a parallel worker told to stop) leaves
/// through proc_exit without unwinding, so no guard runs: its child is killed and reaped here. An orphan ran on
/// to its limits, and a postmaster that is PID 1 (as in containers) reaped it as a crashed backend and
/// restarted the cluster (found by a red-team run).
fn reap_children_at_exit() {
    EXIT_CALLBACK.call_once(|| {
        // SAFETY: registers a callback with PostgreSQL's exit handling, once per process (the postmaster never
        // extracts, so no child process inherits a registration it would then run).
        unsafe { pg_sys::on_proc_exit(Some(kill_running_child), pg_sys::Datum::from(0usize)) };
    });
}

// SAFETY (for callers): PostgreSQL calls it once while the process exits.
#[pg_guard]
unsafe extern "C-unwind" fn kill_running_child(_code: std::ffi::c_int, _argument: pg_sys::Datum) {
    let pid = RUNNING_CHILD.swap(0, std::sync::atomic::Ordering::Relaxed);
    if pid > 0 {
        let mut status = 0;
        // SAFETY: our own child; SIGKILL then a wait that SIGKILL makes short.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, &mut status, 0);
        }
    }
    crate::api::extraction_slots::release_at_exit();
}

/// A child extraction: killed and reaped when dropped unwaited (a cancel raised while it ran).
struct Child {
    pid: libc::pid_t,
    fd: libc::c_int,
    reaped: bool,
}

impl Child {
    /// Waits for the child; the signal that ended it, if one did.
    fn wait(mut self) -> Option<libc::c_int> {
        let mut status = 0;
        // SAFETY: waiting for our own child, once.
        let waited = unsafe { libc::waitpid(self.pid, &mut status, 0) };
        self.reaped = true;
        RUNNING_CHILD.store(0, std::sync::atomic::Ordering::Relaxed);
        (waited == self.pid && libc::WIFSIGNALED(status)).then(|| libc::WTERMSIG(status))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // SAFETY: our own child and descriptor; SIGKILL then a blocking wait, which SIGKILL makes short.
        unsafe {
            if !self.reaped {
                libc::kill(self.pid, libc::SIGKILL);
                let mut status = 0;
                libc::waitpid(self.pid, &mut status, 0);
                RUNNING_CHILD.store(0, std::sync::atomic::Ordering::Relaxed);
            }
            libc::close(self.fd);
        }
    }
}

/// The child's whole life: limits, the extraction, its result as JSON down the pipe, `_exit`.
fn extract_in_child(
    parent: libc::pid_t,
    fd: libc::c_int,
    data: &[u8],
    job: Job<'_>,
    limits: &Limits,
    bounds: ChildBounds,
) -> ! {
    // SAFETY: in the child, on its only thread: signal dispositions and resource limits of this process alone;
    // reading /proc/self/statm; writing to our end of the pipe; _exit without running the backend's exit
    // handlers, which would act on the parent's shared state.
    unsafe {
        // Dies with its backend, however the backend ends (SIGKILL included), and checks it did not already.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != parent {
            libc::_exit(1);
        }
        // Named apart from its backend (ps and top show `rag extract`; its command line stays the backend's).
        libc::prctl(libc::PR_SET_NAME, c"rag extract".as_ptr());
        // No core file of a child that runs out of memory: it would hold the shared buffers it maps.
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::prctl(libc::PR_SET_DUMPABLE, 0);
        for signal in [
            libc::SIGFPE,
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGQUIT,
            libc::SIGUSR1,
            libc::SIGUSR2,
            libc::SIGALRM,
            libc::SIGHUP,
        ] {
            libc::signal(signal, libc::SIG_DFL);
        }
        let page = libc::sysconf(libc::_SC_PAGESIZE).max(4096) as u64;
        let inherited = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|statm| {
                statm
                    .split_whitespace()
                    .next()
                    .and_then(|pages| pages.parse::<u64>().ok())
            })
            .map_or(0, |pages| pages * page);
        let address_space = libc::rlimit {
            rlim_cur: inherited.saturating_add(bounds.address_space_bytes),
            rlim_max: inherited.saturating_add(bounds.address_space_bytes),
        };
        libc::setrlimit(libc::RLIMIT_AS, &address_space);
        let cpu = libc::rlimit {
            rlim_cur: bounds.cpu_seconds,
            rlim_max: bounds.cpu_seconds + 5,
        };
        libc::setrlimit(libc::RLIMIT_CPU, &cpu);
        // A timer of the backend's is not inherited across fork, so this is the child's only alarm.
        libc::alarm(bounds.wall_seconds() as libc::c_uint);
        let result = std::panic::catch_unwind(|| job.run(data, limits)).unwrap_or_else(|_| {
            Err(rag_extract::ExtractError::Corrupt {
                format: rag_extract::Format::Text,
                detail: "the extraction failed".to_string(),
            })
        });
        if let Ok(reply) = serde_json::to_vec(&result) {
            let mut written = 0;
            while written < reply.len() {
                let n = libc::write(fd, reply[written..].as_ptr().cast(), reply.len() - written);
                if n <= 0 {
                    break;
                }
                written += n as usize;
            }
        }
        libc::_exit(0)
    }
}

pub fn extract_or_raise(data: &[u8], filename: Option<&str>) -> Extracted {
    extract_interruptibly(data, Job::File(filename)).unwrap_or_raise()
}

/// What a child is forked for.
#[derive(Clone, Copy)]
enum Job<'a> {
    /// A file, its format detected (the name a tie-breaker).
    File(Option<&'a str>),
    /// HTML or Markdown text to convert, as rag_html_to_text / rag_markdown_to_text do.
    Markup(rag_extract::Format),
}

impl Job<'_> {
    fn run(self, data: &[u8], limits: &Limits) -> Result<Extracted, rag_extract::ExtractError> {
        match self {
            Job::File(filename) => extract(data, filename, limits),
            Job::Markup(format) => {
                // The caller's text, valid UTF-8 by construction.
                let text = String::from_utf8_lossy(data);
                let converted = match format {
                    rag_extract::Format::Markdown => rag_extract::markdown_to_text(&text),
                    _ => rag_extract::html_to_text(&text),
                };
                Ok(Extracted {
                    format,
                    sections: vec![rag_extract::Section {
                        locator: None,
                        text: converted,
                    }],
                })
            }
        }
    }
}

/// HTML or Markdown as plain text. Conversion holds dozens of times its input (42 bytes a byte for a text of
/// two-character lines) and checks no interrupt, so past [`crate::limits::MARKUP_IN_PROCESS_MAX_BYTES`] it runs
/// in a child as a file's extraction does: under rag.extraction_memory and rag.extraction_cpu_time, in an
/// extraction slot, and ended by a cancel (a 32 MB Markdown text took 43 s and 2.7 GB of the backend, and a
/// cancel 22 s to act: red team 8). Smaller texts (a CMS page, most watched rows) are converted here, at once.
/// The rag worker too converts a larger one in the child (without an extraction slot): in its own process a
/// table owner's 63 MB Markdown row took 2.3 GB and, under a memory limit, aborted the server, and the worker
/// took the row up again after every restart (red team 18).
fn convert_markup(text: &str, format: rag_extract::Format) -> String {
    require_convertible(
        text.len(),
        if format == rag_extract::Format::Markdown {
            "Markdown"
        } else {
            "HTML"
        },
    );
    if text.len() <= crate::limits::MARKUP_IN_PROCESS_MAX_BYTES {
        return match format {
            rag_extract::Format::Markdown => rag_extract::markdown_to_text(text),
            _ => rag_extract::html_to_text(text),
        };
    }
    extract_interruptibly(text.as_bytes(), Job::Markup(format))
        .unwrap_or_raise()
        .text()
}

/// The text of a file (PDF, DOCX, XLSX, PPTX, ODT, ODS, ODP, HTML, Markdown, CSV, JSON, XML, YAML, TXT),
/// sections separated by blank lines.
#[pg_extern(immutable, parallel_safe)]
pub fn rag_extract_text(data: Option<&[u8]>, filename: default!(Option<&str>, "NULL")) -> String {
    let data = crate::error::required(data, "data").unwrap_or_raise();
    extract_or_raise(data, filename).text()
}

/// The parts of a file with what a citation would call them: `p. 3`, `slide 2`, `sheet "Q3"`.
#[pg_extern(immutable, parallel_safe)]
pub fn rag_extract_sections(
    data: Option<&[u8]>,
    filename: default!(Option<&str>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(format, String),
        name!(locator, Option<String>),
        name!(text, String),
    ),
> {
    let data = crate::error::required(data, "data").unwrap_or_raise();
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
    collection: Option<&str>,
    filename: Option<&str>,
    data: Option<&[u8]>,
    metadata: default!(Option<crate::pg::RawJsonb>, "'{}'"),
    title: default!(Option<&str>, "NULL"),
) -> i64 {
    let (collection, filename, data) = (|| {
        Ok::<_, crate::error::RagError>((
            crate::error::required(collection, "collection")?,
            crate::error::required(filename, "filename")?,
            crate::error::required(data, "data")?,
        ))
    })()
    .unwrap_or_raise();
    crate::api::require_writable("rag_ingest_file").unwrap_or_raise();
    // Refused before the file is read: extraction may hold hundreds of megabytes (a small archive can name one
    // slide thousands of times) that a caller without the write privilege must not make the server spend.
    // So is metadata over its bound, which rag_ingest refuses too, but only after the file's format joins it.
    Spi::get_one_with_args::<i32>(
        "SELECT rag._collection_id($1, 'write') FROM rag._require_metadata_fits($2)",
        &[
            collection.into(),
            metadata.as_ref().map(|raw| raw.borrowed()).into(),
        ],
    )
    .doing(|| format!("checking the collection \"{collection}\""))
    .unwrap_or_raise();
    let extracted = extract_or_raise(data, Some(filename));
    let format = extracted.format.to_string();
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
        // The file's format joins metadata that is an object and does not name one; rag_ingest checks the
        // metadata's size and shape, as it does for every document.
        let rows = client.update(
            "SELECT rag_definer.rag_ingest($1, $2, $3,
                        CASE WHEN jsonb_typeof(coalesce($4, '{}')) = 'object' AND NOT coalesce($4, '{}') ? 'format'
                             THEN coalesce($4, '{}') || jsonb_build_object('format', $7::text)
                             ELSE $4 END,
                        $5, $6)",
            Some(1),
            &[
                collection.into(),
                title.into(),
                body.into(),
                metadata.into(),
                pages.into(),
                filename.into(),
                format.into(),
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
    convert_markup(html, rag_extract::Format::Html)
}

/// Markdown as plain text with its paragraph structure.
#[pg_extern(immutable, parallel_safe, strict)]
pub fn rag_markdown_to_text(markdown: &str) -> String {
    convert_markup(markdown, rag_extract::Format::Markdown)
}

#[pg_schema]
pub mod rag {
    use crate::error::UnwrapOrRaise;
    use pgrx::prelude::*;

    /// Whether `text` holds anything but whitespace (Unicode's, as the chunker and rag_ask see it). PostgreSQL's
    /// `btrim` would answer the same with twelve bytes of pointers per byte of a multibyte database's text: 770 MB
    /// for a 64 MB document, in the ingesting backend or in a worker reading a watched row.
    #[pg_extern(immutable, parallel_safe, strict, name = "_has_text")]
    pub fn has_text(text: &str) -> bool {
        !text.chars().all(char::is_whitespace)
    }

    /// Text in the given format ('text', 'html', 'markdown') as plain text for chunking.
    #[pg_extern(immutable, parallel_safe, name = "_to_text")]
    pub fn to_text(text: Option<&str>, format: Option<&str>) -> Option<String> {
        let text = text?;
        let format = crate::error::required(format, "format").unwrap_or_raise();
        Some(match format {
            "html" => super::convert_markup(text, rag_extract::Format::Html),
            "markdown" => super::convert_markup(text, rag_extract::Format::Markdown),
            _ => text.to_string(),
        })
    }
}
