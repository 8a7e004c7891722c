//! PDF text per page, through lopdf for the object model and an own content-stream walker for layout.
//!
//! lopdf's `extract_text` concatenates shown strings and ignores positioning, which glues words that a producer
//! placed with `Td`/`TJ` offsets instead of space characters. The walker here tracks the text and graphics
//! matrices and inserts a space when the gap between two runs is wider than a fraction of the font size, and a
//! line break when the baseline moves.
//!
//! Safety: lopdf bounds its own parser nesting and decompression; on top of that the whole extraction runs on a
//! dedicated thread with a large stack (a recursion lopdf does not bound cannot reach the backend's stack), pages
//! are deduplicated (a cyclic `/Kids` graph cannot repeat pages), form XObjects are followed to a fixed depth and
//! count, and the total decompressed content is charged against [`Limits::max_decompressed_bytes`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;

use lopdf::content::Content;
use lopdf::{DecompressError, Dictionary, Document, Encoding, LoadOptions, Object, ObjectId};

use crate::{catch_panic, ExtractError, Format, Limits, Section};

const PARSER_STACK_BYTES: usize = 64 * 1024 * 1024;
const MAX_FORM_DEPTH: usize = 8;
const MAX_FORMS_PER_PAGE: usize = 512;
const MAX_GRAPHICS_STACK: usize = 256;

pub(crate) fn extract(data: &[u8], limits: &Limits) -> Result<Vec<Section>, ExtractError> {
    std::thread::scope(|scope| {
        let builder = std::thread::Builder::new()
            .name("rag-extract-pdf".into())
            .stack_size(PARSER_STACK_BYTES);
        let worker = rag_threads::spawn_scoped(builder, scope, || {
            // The text budget lives on the thread that builds the text: this one.
            crate::textbuf::start_text_budget(limits.max_text_bytes);
            let sections = catch_panic(Format::Pdf, || extract_pages(data, limits))?;
            if crate::textbuf::text_budget_exceeded() {
                return Err(ExtractError::TooLarge {
                    what: "bytes of extracted text".into(),
                    limit: limits.max_text_bytes,
                });
            }
            Ok(sections)
        })
        .map_err(|e| ExtractError::OutOfResources {
            detail: format!("cannot start the PDF parser thread: {e}"),
        })?;
        worker.join().unwrap_or_else(|_| {
            Err(ExtractError::corrupt(
                Format::Pdf,
                "PDF parser thread failed",
            ))
        })
    })
}

fn too_large(limits: &Limits) -> ExtractError {
    ExtractError::TooLarge {
        what: "decompressed pdf stream bytes".into(),
        limit: limits.max_decompressed_bytes,
    }
}

fn load_error(error: lopdf::Error, limits: &Limits) -> ExtractError {
    match error {
        lopdf::Error::InvalidPassword | lopdf::Error::Decryption(_) => ExtractError::Encrypted {
            format: Format::Pdf,
        },
        lopdf::Error::Decompress(DecompressError::MemoryLimitExceeded { .. }) => too_large(limits),
        other => ExtractError::corrupt(Format::Pdf, other.to_string()),
    }
}

fn extract_pages(data: &[u8], limits: &Limits) -> Result<Vec<Section>, ExtractError> {
    let options = LoadOptions {
        max_decompressed_size: Some(limits.max_decompressed_bytes),
        ..Default::default()
    };
    let doc = Document::load_mem_with_options(data, options).map_err(|e| load_error(e, limits))?;
    // lopdf opens files whose user password is empty; for the others the objects stay encrypted.
    if doc.is_encrypted() && !doc.was_encrypted() {
        return Err(ExtractError::Encrypted {
            format: Format::Pdf,
        });
    }
    let pages = page_ids(&doc);
    if pages.len() > limits.max_pdf_pages {
        return Err(ExtractError::TooLarge {
            what: "pdf pages".into(),
            limit: limits.max_pdf_pages,
        });
    }
    if pages.is_empty() {
        return Err(ExtractError::corrupt(
            Format::Pdf,
            "document has no pages (damaged page tree)",
        ));
    }
    let mut extractor = PageExtractor {
        doc: &doc,
        fonts: HashMap::new(),
        budget_left: limits.max_decompressed_bytes,
    };
    let mut sections = Vec::with_capacity(pages.len());
    for (index, page) in pages.into_iter().enumerate() {
        let text = extractor.page_text(page).map_err(|e| match e {
            PageError::Budget => too_large(limits),
            PageError::Tokens => ExtractError::TooLarge {
                what: "tokens in one pdf content stream".into(),
                limit: MAX_CONTENT_TOKENS,
            },
            PageError::Nesting => ExtractError::TooDeep {
                format: Format::Pdf,
                limit: MAX_CONTENT_NESTING,
            },
        })?;
        sections.push(Section {
            locator: Some(format!("p. {}", index + 1)),
            text,
        });
    }
    Ok(sections)
}

/// Pages in document order. The page tree is walked iteratively with a visited set, so a `/Kids` cycle neither
/// repeats pages nor hides the rest of the tree (lopdf's iterator gives up on such trees); when the tree yields
/// nothing, every `/Type /Page` object is taken in object order, as forgiving viewers do.
fn page_ids(doc: &Document) -> Vec<ObjectId> {
    let mut pages = Vec::new();
    let mut visited = HashSet::new();
    let root = doc
        .catalog()
        .ok()
        .and_then(|c| c.get(b"Pages").ok())
        .and_then(|o| o.as_reference().ok());
    let mut stack: Vec<ObjectId> = root.into_iter().collect();
    while let Some(id) = stack.pop() {
        if !visited.insert(id) {
            continue;
        }
        let Ok(node) = doc.get_dictionary(id) else {
            continue;
        };
        match node
            .get(b"Kids")
            .map(|o| deref(doc, o))
            .and_then(Object::as_array)
        {
            Ok(kids) if node.get_type().ok() != Some(b"Page".as_slice()) => {
                stack.extend(kids.iter().rev().filter_map(|k| k.as_reference().ok()));
            }
            _ => pages.push(id),
        }
    }
    if pages.is_empty() {
        pages = doc
            .objects
            .iter()
            .filter(|(_, object)| {
                object
                    .as_dict()
                    .is_ok_and(|d| d.get_type().ok() == Some(b"Page".as_slice()))
            })
            .map(|(id, _)| *id)
            .collect();
    }
    pages
}

enum PageError {
    Budget,
    /// A content stream with more tokens than [`MAX_CONTENT_TOKENS`].
    Tokens,
    /// A content stream nesting dictionaries and arrays deeper than [`MAX_CONTENT_NESTING`].
    Nesting,
}

/// The deepest a content stream may nest `<< >>` and `[ ]` to be decoded. Operands are flat but for an inline
/// image's dictionary, a marked-content property list and a TJ array, a level or two each; lopdf's decoder
/// gives up on deep nesting without saying why, and the page then read as having no text, which sent the user
/// to OCR (red team 12: 100,000 levels before a `Tj`).
const MAX_CONTENT_NESTING: usize = 64;

/// How deep a content stream nests `<<`/`[`, strings and comments skipped roughly (an unbalanced string only
/// errs towards a deeper count).
fn content_nesting(content: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut in_comment) = (0usize, 0usize, 0usize, false);
    let mut bytes = content.iter().peekable();
    while let Some(&byte) = bytes.next() {
        if in_comment {
            in_comment = !matches!(byte, b'\r' | b'\n');
            continue;
        }
        if in_string > 0 {
            match byte {
                b'\\' => {
                    bytes.next();
                }
                b'(' => in_string += 1,
                b')' => in_string -= 1,
                _ => {}
            }
            continue;
        }
        match byte {
            b'%' => in_comment = true,
            b'(' => in_string = 1,
            b'[' => depth += 1,
            b']' => depth = depth.saturating_sub(1),
            b'<' if bytes.peek() == Some(&&b'<') => {
                bytes.next();
                depth += 1;
            }
            b'>' if bytes.peek() == Some(&&b'>') => {
                bytes.next();
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        deepest = deepest.max(depth);
    }
    deepest
}

/// The most tokens (operands and operators) one content stream may have to be decoded. lopdf's decoder builds an
/// object of a hundred bytes and more for every token, so 120 MB of `1 1 1 …` (117 KB compressed) asked for
/// gigabytes, and a failed allocation aborts the server. A page of dense text has tens of thousands.
const MAX_CONTENT_TOKENS: usize = 2_000_000;

/// Counts the tokens of a content stream without decoding it: the starts of runs of regular characters, and
/// each delimiter. Over-counts inside strings (every word of a `(…) Tj`), which only errs towards the limit.
fn content_tokens(content: &[u8]) -> usize {
    let mut tokens = 0;
    let mut in_run = false;
    for byte in content {
        match byte {
            b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' | b'\0' => in_run = false,
            b'[' | b']' | b'(' | b')' | b'<' | b'>' | b'{' | b'}' | b'/' | b'%' => {
                tokens += 1;
                in_run = false;
            }
            _ => {
                if !in_run {
                    tokens += 1;
                    in_run = true;
                }
            }
        }
    }
    tokens
}

/// Glyph metrics and text decoding of one font.
struct FontInfo<'a> {
    /// The ToUnicode map; producers often map only the glyphs the base encoding gets wrong (ligatures), so codes
    /// it leaves out fall through to `encoding`.
    unicode: Option<Encoding<'a>>,
    encoding: Option<Encoding<'a>>,
    code_bytes: usize,
    widths: HashMap<u32, f32>,
    default_width: f32,
}

impl FontInfo<'_> {
    fn decode(&self, bytes: &[u8]) -> String {
        let mut out = String::new();
        for code in bytes.chunks(self.code_bytes) {
            // A ToUnicode map may turn each code into many characters: stop at what the budget still allows
            // (the page's text spends it below).
            if out.len() > crate::textbuf::text_left() {
                crate::textbuf::spend_text(usize::MAX);
                break;
            }
            let mapped = self
                .unicode
                .as_ref()
                .and_then(|map| map.bytes_to_string(code).ok());
            match mapped.filter(|s| !s.is_empty() && !s.contains('\u{FFFD}')) {
                Some(text) => out.push_str(&text),
                None => self.decode_without_map(code, &mut out),
            }
        }
        out.retain(|c| c != '\u{FFFD}' && (c == ' ' || !c.is_control()));
        out
    }

    fn decode_without_map(&self, code: &[u8], out: &mut String) {
        let before = out.len();
        let decoded = match &self.encoding {
            Some(encoding) => encoding.write_to_string(code, out).is_ok(),
            None => false,
        };
        if !decoded {
            out.truncate(before);
            // Without a usable encoding only single-byte codes have a plausible reading (Latin-1 compatible).
            if self.code_bytes == 1 {
                out.extend(code.iter().map(|b| char::from(*b)));
            }
        }
    }

    fn codes<'b>(&self, bytes: &'b [u8]) -> impl Iterator<Item = u32> + 'b {
        let width = self.code_bytes;
        bytes
            .chunks(width)
            .map(|chunk| chunk.iter().fold(0u32, |acc, b| (acc << 8) | u32::from(*b)))
    }

    fn width(&self, code: u32) -> f32 {
        self.widths
            .get(&code)
            .copied()
            .unwrap_or(self.default_width)
            / 1000.0
    }
}

fn number(object: &Object) -> Option<f32> {
    object.as_float().ok().filter(|v| v.is_finite())
}

fn deref<'a>(doc: &'a Document, object: &'a Object) -> &'a Object {
    doc.dereference(object).map(|(_, o)| o).unwrap_or(object)
}

fn dict_entry<'a>(doc: &'a Document, dict: &'a Dictionary, key: &[u8]) -> Option<&'a Object> {
    dict.get(key).ok().map(|o| deref(doc, o))
}

fn font_info<'a>(doc: &'a Document, font: &'a Dictionary, limit: usize) -> FontInfo<'a> {
    let subtype = font
        .get(b"Subtype")
        .and_then(Object::as_name)
        .unwrap_or(b"");
    let composite = subtype == b"Type0";
    let mut widths = HashMap::new();
    let mut default_width = 500.0;
    if composite {
        default_width = 1000.0;
        let descendant = dict_entry(doc, font, b"DescendantFonts")
            .and_then(|o| o.as_array().ok())
            .and_then(|a| a.first())
            .and_then(|o| deref(doc, o).as_dict().ok());
        if let Some(descendant) = descendant {
            if let Some(dw) = dict_entry(doc, descendant, b"DW").and_then(number) {
                default_width = dw;
            }
            if let Some(w) = dict_entry(doc, descendant, b"W").and_then(|o| o.as_array().ok()) {
                parse_cid_widths(doc, w, &mut widths);
            }
        }
    } else {
        let first = dict_entry(doc, font, b"FirstChar")
            .and_then(number)
            .unwrap_or(0.0)
            .max(0.0) as u32;
        if let Some(list) = dict_entry(doc, font, b"Widths").and_then(|o| o.as_array().ok()) {
            for (offset, w) in list.iter().take(256).enumerate() {
                if let Some(w) = number(deref(doc, w)) {
                    widths.insert(first + offset as u32, w);
                }
            }
        }
        let missing = dict_entry(doc, font, b"FontDescriptor")
            .and_then(|o| o.as_dict().ok())
            .and_then(|d| dict_entry(doc, d, b"MissingWidth"))
            .and_then(number);
        if let Some(missing) = missing.filter(|w| *w > 0.0) {
            default_width = missing;
        }
    }
    FontInfo {
        unicode: unicode_map(doc, font, limit),
        encoding: font.get_font_encoding_with_limit(doc, limit).ok(),
        code_bytes: if composite { 2 } else { 1 },
        widths,
        default_width,
    }
}

/// The font's ToUnicode map, which takes precedence over `/Encoding` for text extraction (lopdf prefers
/// `/Encoding`, which turns subset fonts with custom glyph names into garbage).
fn unicode_map<'a>(doc: &'a Document, font: &Dictionary, limit: usize) -> Option<Encoding<'a>> {
    let to_unicode = font.get(b"ToUnicode").ok()?.clone();
    let mut only_map = Dictionary::new();
    only_map.set("Type", Object::Name(b"Font".to_vec()));
    only_map.set("Encoding", Object::Name(b"Identity-H".to_vec()));
    only_map.set("ToUnicode", to_unicode);
    match only_map.get_font_encoding_with_limit(doc, limit) {
        Ok(Encoding::UnicodeMapEncoding(map)) => Some(Encoding::UnicodeMapEncoding(map)),
        _ => None,
    }
}

/// The `/W` array of a CID font: `c [w1 w2 ...]` or `c_first c_last w`.
fn parse_cid_widths(doc: &Document, list: &[Object], widths: &mut HashMap<u32, f32>) {
    const MAX_ENTRIES: usize = 65_536;
    let mut i = 0;
    while i < list.len() && widths.len() < MAX_ENTRIES {
        let Some(first) = number(deref(doc, &list[i])) else {
            return;
        };
        let first = first.max(0.0) as u32;
        match list.get(i + 1).map(|o| deref(doc, o)) {
            Some(Object::Array(run)) => {
                for (offset, w) in run.iter().take(MAX_ENTRIES).enumerate() {
                    if let Some(w) = number(deref(doc, w)) {
                        widths.insert(first.saturating_add(offset as u32), w);
                    }
                }
                i += 2;
            }
            Some(last) => {
                let (Some(last), Some(w)) = (
                    number(last),
                    list.get(i + 2).and_then(|o| number(deref(doc, o))),
                ) else {
                    return;
                };
                let last = (last.max(0.0) as u32).min(first.saturating_add(MAX_ENTRIES as u32));
                for code in first..=last {
                    widths.insert(code, w);
                }
                i += 3;
            }
            None => return,
        }
    }
}

type Matrix = [f32; 6];
const IDENTITY: Matrix = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0];

fn multiply(a: &Matrix, b: &Matrix) -> Matrix {
    [
        a[0] * b[0] + a[1] * b[2],
        a[0] * b[1] + a[1] * b[3],
        a[2] * b[0] + a[3] * b[2],
        a[2] * b[1] + a[3] * b[3],
        a[4] * b[0] + a[5] * b[2] + b[4],
        a[4] * b[1] + a[5] * b[3] + b[5],
    ]
}

fn matrix_operand(operands: &[Object]) -> Option<Matrix> {
    if operands.len() < 6 {
        return None;
    }
    let mut m = [0.0; 6];
    for (slot, operand) in m.iter_mut().zip(operands) {
        *slot = number(operand)?;
    }
    Some(m)
}

/// The nearest `/Resources` of a page, inherited through `/Parent` (followed with a visited set: cyclic
/// parents are common in damaged files, and lopdf's own lookup gives up on them).
fn page_resources(doc: &Document, page: ObjectId) -> Option<&Dictionary> {
    let mut visited = HashSet::new();
    let mut node = doc.get_dictionary(page).ok()?;
    loop {
        if let Some(resources) = dict_entry(doc, node, b"Resources").and_then(|o| o.as_dict().ok())
        {
            return Some(resources);
        }
        let parent = node.get(b"Parent").ok()?.as_reference().ok()?;
        if !visited.insert(parent) {
            return None;
        }
        node = doc.get_dictionary(parent).ok()?;
    }
}

fn scope_of<'a>(doc: &'a Document, resources: &'a Dictionary) -> Scope<'a> {
    let mut fonts = BTreeMap::new();
    if let Some(font_dict) = dict_entry(doc, resources, b"Font").and_then(|o| o.as_dict().ok()) {
        for (key, value) in font_dict.iter() {
            if let Ok(font) = deref(doc, value).as_dict() {
                fonts.insert(key.clone(), font);
            }
        }
    }
    let xobjects = dict_entry(doc, resources, b"XObject")
        .and_then(|o| o.as_dict().ok())
        .into_iter()
        .collect();
    Scope { fonts, xobjects }
}

/// Fonts and form XObjects visible to a content stream.
#[derive(Default)]
struct Scope<'a> {
    fonts: BTreeMap<Vec<u8>, &'a Dictionary>,
    xobjects: Vec<&'a Dictionary>,
}

struct PageExtractor<'a> {
    doc: &'a Document,
    /// Fonts are shared between pages; parsing a ToUnicode map once per document rather than per page matters.
    fonts: HashMap<*const Dictionary, Rc<FontInfo<'a>>>,
    budget_left: usize,
}

/// Text state while walking one page.
struct TextState<'a> {
    out: String,
    ctm: Matrix,
    saved: Vec<Matrix>,
    text_matrix: Matrix,
    line_matrix: Matrix,
    font: Option<Rc<FontInfo<'a>>>,
    font_size: f32,
    char_spacing: f32,
    word_spacing: f32,
    horizontal_scale: f32,
    leading: f32,
    /// End of the previous run (device space) and its font size, to judge the gap to the next one.
    last_end: Option<(f32, f32, f32)>,
    forms_used: usize,
}

impl<'a> PageExtractor<'a> {
    fn page_text(&mut self, page: ObjectId) -> Result<String, PageError> {
        let doc = self.doc;
        let content = match doc.get_page_content_with_limit(page, self.budget_left) {
            Ok(content) => content,
            Err(lopdf::Error::Decompress(DecompressError::MemoryLimitExceeded { .. })) => {
                return Err(PageError::Budget)
            }
            // A page whose content cannot be read renders blank; other pages may still have text.
            Err(_) => return Ok(String::new()),
        };
        self.budget_left = self.budget_left.saturating_sub(content.len());
        let scope = page_resources(doc, page)
            .map(|r| scope_of(doc, r))
            .unwrap_or_default();
        let mut state = TextState {
            out: String::new(),
            ctm: IDENTITY,
            saved: Vec::new(),
            text_matrix: IDENTITY,
            line_matrix: IDENTITY,
            font: None,
            font_size: 0.0,
            char_spacing: 0.0,
            word_spacing: 0.0,
            horizontal_scale: 1.0,
            leading: 0.0,
            last_end: None,
            forms_used: 0,
        };
        self.run(&content, &scope, &mut state, 0)?;
        Ok(state.out)
    }

    fn font(&mut self, dict: &'a Dictionary) -> Rc<FontInfo<'a>> {
        let key = dict as *const Dictionary;
        if let Some(info) = self.fonts.get(&key) {
            return info.clone();
        }
        let info = Rc::new(font_info(self.doc, dict, self.budget_left));
        self.fonts.insert(key, info.clone());
        info
    }

    fn run(
        &mut self,
        content: &[u8],
        scope: &Scope<'a>,
        state: &mut TextState<'a>,
        depth: usize,
    ) -> Result<(), PageError> {
        if content_tokens(content) > MAX_CONTENT_TOKENS {
            return Err(PageError::Tokens);
        }
        if content_nesting(content) > MAX_CONTENT_NESTING {
            return Err(PageError::Nesting);
        }
        // Broken operators are skipped by lopdf's lenient decoder; a stream that fails entirely has no text.
        let Ok(content) = Content::decode(content) else {
            return Ok(());
        };
        for op in &content.operations {
            let operands = op.operands.as_slice();
            match op.operator.as_str() {
                "q" if state.saved.len() < MAX_GRAPHICS_STACK => state.saved.push(state.ctm),
                "Q" => {
                    if let Some(ctm) = state.saved.pop() {
                        state.ctm = ctm;
                    }
                }
                "cm" => {
                    if let Some(m) = matrix_operand(operands) {
                        state.ctm = multiply(&m, &state.ctm);
                    }
                }
                "BT" => {
                    state.text_matrix = IDENTITY;
                    state.line_matrix = IDENTITY;
                }
                "Tf" => {
                    let font = operands
                        .first()
                        .and_then(|o| o.as_name().ok())
                        .and_then(|name| scope.fonts.get(name).copied());
                    state.font = font.map(|dict| self.font(dict));
                    state.font_size = operands.get(1).and_then(number).unwrap_or(0.0);
                }
                "Tc" => state.char_spacing = operands.first().and_then(number).unwrap_or(0.0),
                "Tw" => state.word_spacing = operands.first().and_then(number).unwrap_or(0.0),
                "Tz" => {
                    state.horizontal_scale =
                        operands.first().and_then(number).unwrap_or(100.0) / 100.0
                }
                "TL" => state.leading = operands.first().and_then(number).unwrap_or(0.0),
                "Td" | "TD" => {
                    let tx = operands.first().and_then(number).unwrap_or(0.0);
                    let ty = operands.get(1).and_then(number).unwrap_or(0.0);
                    if op.operator == "TD" {
                        state.leading = -ty;
                    }
                    state.move_line(tx, ty);
                }
                "Tm" => {
                    if let Some(m) = matrix_operand(operands) {
                        state.text_matrix = m;
                        state.line_matrix = m;
                    }
                }
                "T*" => state.next_line(),
                "Tj" => {
                    if let Some(bytes) = operands.first().and_then(|o| o.as_str().ok()) {
                        state.show(bytes);
                    }
                }
                "'" => {
                    state.next_line();
                    if let Some(bytes) = operands.first().and_then(|o| o.as_str().ok()) {
                        state.show(bytes);
                    }
                }
                "\"" => {
                    state.word_spacing = operands
                        .first()
                        .and_then(number)
                        .unwrap_or(state.word_spacing);
                    state.char_spacing = operands
                        .get(1)
                        .and_then(number)
                        .unwrap_or(state.char_spacing);
                    state.next_line();
                    if let Some(bytes) = operands.get(2).and_then(|o| o.as_str().ok()) {
                        state.show(bytes);
                    }
                }
                "TJ" => {
                    if let Some(items) = operands.first().and_then(|o| o.as_array().ok()) {
                        for item in items {
                            match item {
                                Object::String(bytes, _) => state.show(bytes),
                                other => {
                                    if let Some(adjust) = number(other) {
                                        let tx = -adjust / 1000.0
                                            * state.font_size
                                            * state.horizontal_scale;
                                        state.advance(tx);
                                    }
                                }
                            }
                        }
                    }
                }
                "Do" => {
                    if let Some(name) = operands.first().and_then(|o| o.as_name().ok()) {
                        self.form(name, scope, state, depth)?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Runs a form XObject's content with its own resources and matrix.
    fn form(
        &mut self,
        name: &[u8],
        scope: &Scope<'a>,
        state: &mut TextState<'a>,
        depth: usize,
    ) -> Result<(), PageError> {
        if depth >= MAX_FORM_DEPTH || state.forms_used >= MAX_FORMS_PER_PAGE {
            return Ok(());
        }
        let doc = self.doc;
        let Some(stream) = scope
            .xobjects
            .iter()
            .find_map(|x| x.get(name).ok())
            .and_then(|o| deref(doc, o).as_stream().ok())
        else {
            return Ok(());
        };
        if stream.dict.get(b"Subtype").and_then(Object::as_name).ok() != Some(b"Form".as_slice()) {
            return Ok(());
        }
        state.forms_used += 1;
        let content = match stream.decompressed_content_with_limit(self.budget_left) {
            Ok(content) => content,
            Err(lopdf::Error::Decompress(DecompressError::MemoryLimitExceeded { .. })) => {
                return Err(PageError::Budget)
            }
            Err(_) if stream.content.len() <= self.budget_left => stream.content.clone(),
            Err(_) => return Err(PageError::Budget),
        };
        self.budget_left = self.budget_left.saturating_sub(content.len());
        let inner_scope = dict_entry(doc, &stream.dict, b"Resources")
            .and_then(|o| o.as_dict().ok())
            .map(|r| scope_of(doc, r));
        // A form without resources uses those of the page that invokes it.
        let scope = inner_scope.as_ref().unwrap_or(scope);
        let saved_ctm = state.ctm;
        if let Some(matrix) = dict_entry(doc, &stream.dict, b"Matrix")
            .and_then(|o| o.as_array().ok())
            .and_then(|a| matrix_operand(a))
        {
            state.ctm = multiply(&matrix, &state.ctm);
        }
        let saved_font = (state.font.clone(), state.font_size);
        let result = self.run(&content, scope, state, depth + 1);
        state.ctm = saved_ctm;
        (state.font, state.font_size) = saved_font;
        result
    }
}

impl TextState<'_> {
    fn move_line(&mut self, tx: f32, ty: f32) {
        self.line_matrix = multiply(&[1.0, 0.0, 0.0, 1.0, tx, ty], &self.line_matrix);
        self.text_matrix = self.line_matrix;
    }

    fn next_line(&mut self) {
        self.move_line(0.0, -self.leading);
    }

    fn advance(&mut self, tx: f32) {
        self.text_matrix = multiply(&[1.0, 0.0, 0.0, 1.0, tx, 0.0], &self.text_matrix);
    }

    /// Device-space position of the text origin and the effective font size there.
    fn position(&self) -> (f32, f32, f32) {
        let m = multiply(&self.text_matrix, &self.ctm);
        let scale = (m[2] * m[2] + m[3] * m[3]).sqrt();
        (m[4], m[5], (self.font_size * scale).abs())
    }

    fn show(&mut self, bytes: &[u8]) {
        let Some(font) = self.font.clone() else {
            return;
        };
        let text = font.decode(bytes);
        let (x, y, size) = self.position();
        if !text.is_empty() && crate::textbuf::spend_text(text.len() + 2) {
            if let Some((last_x, last_y, last_size)) = self.last_end {
                let size_ref = size.max(last_size).max(1.0);
                let dy = (y - last_y).abs();
                let ends_blank = self.out.ends_with(char::is_whitespace);
                if dy > 1.8 * size_ref {
                    self.out.push_str("\n\n");
                } else if dy > 0.5 * size_ref {
                    self.out.push('\n');
                } else {
                    let dx = x - last_x;
                    // A gap wider than ~a fifth of an em is a word space; a jump back means a new column or an
                    // overprint, which must not glue either.
                    if (dx > 0.2 * size_ref || dx < -size_ref)
                        && !ends_blank
                        && !text.starts_with(char::is_whitespace)
                    {
                        self.out.push(' ');
                    }
                }
            }
            self.out.push_str(&text);
        }
        let mut tx = 0.0;
        for code in font.codes(bytes) {
            let mut advance = font.width(code) * self.font_size + self.char_spacing;
            if font.code_bytes == 1 && code == 32 {
                advance += self.word_spacing;
            }
            tx += advance * self.horizontal_scale;
        }
        self.advance(tx);
        if !text.is_empty() {
            let (end_x, end_y, _) = self.position();
            self.last_end = Some((end_x, end_y, size));
        }
    }
}
