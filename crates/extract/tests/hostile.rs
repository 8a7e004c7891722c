//! Hostile inputs, generated here: each must end in a clear error (or harmless text), quickly, without a panic,
//! a stack overflow or an allocation past the limits.

use std::io::Write;
use std::time::{Duration, Instant};

use rag_extract::{extract, ExtractError, Format, Limits};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

fn zip_of(entries: &[(&str, &[u8])], method: CompressionMethod) -> Vec<u8> {
    let mut writer = ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(method);
    for (name, data) in entries {
        writer.start_file(*name, options).expect("start entry");
        writer.write_all(data).expect("write entry");
    }
    writer.finish().expect("finish zip").into_inner()
}

fn timed<T>(f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let result = f();
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "took {:?}",
        start.elapsed()
    );
    result
}

#[test]
fn empty_input_is_a_clear_error() {
    assert_eq!(
        extract(b"", Some("empty.pdf"), &Limits::default()),
        Err(ExtractError::Empty)
    );
    assert_eq!(
        extract(b"   \n\n", Some("blank.txt"), &Limits::default()),
        Err(ExtractError::NoText {
            format: Format::Text
        })
    );
}

#[test]
fn input_size_limit() {
    let limits = Limits {
        max_input_bytes: 10,
        ..Limits::default()
    };
    let err = extract(b"more than ten bytes", Some("a.txt"), &limits).unwrap_err();
    assert!(
        matches!(err, ExtractError::TooLarge { limit: 10, .. }),
        "{err}"
    );
}

#[test]
fn zip_bomb_stops_at_the_decompression_limit() {
    let payload = vec![b' '; 64 * 1024 * 1024];
    let bomb = zip_of(
        &[("word/document.xml", &payload)],
        CompressionMethod::Deflated,
    );
    assert!(
        bomb.len() < 1024 * 1024,
        "bomb should be small: {}",
        bomb.len()
    );
    let limits = Limits {
        max_decompressed_bytes: 1024 * 1024,
        ..Limits::default()
    };
    let err = timed(|| extract(&bomb, Some("bomb.docx"), &limits)).unwrap_err();
    assert_eq!(
        err,
        ExtractError::TooLarge {
            what: "decompressed docx archive bytes".into(),
            limit: 1024 * 1024
        }
    );
}

#[test]
fn zip_bomb_with_lying_declared_size_is_still_capped() {
    let payload = vec![b'a'; 16 * 1024 * 1024];
    let mut bomb = zip_of(
        &[("word/document.xml", &payload)],
        CompressionMethod::Deflated,
    );
    // Declare an uncompressed size of 100 bytes in the local and central headers.
    let declared = 100u32.to_le_bytes();
    for (signature, offset) in [(b"PK\x03\x04", 22usize), (b"PK\x01\x02", 24usize)] {
        let at = bomb
            .windows(4)
            .position(|w| w == signature)
            .expect("header present");
        bomb[at + offset..at + offset + 4].copy_from_slice(&declared);
    }
    let limits = Limits {
        max_decompressed_bytes: 1024 * 1024,
        ..Limits::default()
    };
    let result = timed(|| extract(&bomb, Some("liar.docx"), &limits));
    // Either the reader stops at the declared size (and the XML is then broken or text-free) or our cap trips;
    // the 16 MiB are never handed to the parser.
    match result {
        Err(
            ExtractError::TooLarge { .. }
            | ExtractError::Corrupt { .. }
            | ExtractError::NoText { .. },
        ) => {}
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn archive_entry_count_limit() {
    let names: Vec<String> = (0..100_000)
        .map(|i| format!("word/media/f{i}.bin"))
        .collect();
    let mut entries: Vec<(&str, &[u8])> =
        names.iter().map(|n| (n.as_str(), b"".as_slice())).collect();
    entries.push(("word/document.xml", b"<w:document/>"));
    let archive = zip_of(&entries, CompressionMethod::Stored);
    let err = timed(|| extract(&archive, Some("many.docx"), &Limits::default())).unwrap_err();
    assert_eq!(
        err,
        ExtractError::TooLarge {
            what: "number of docx archive entries".into(),
            limit: 10_000
        }
    );
}

#[test]
fn deeply_nested_xml_hits_the_depth_limit() {
    let depth = 100_000;
    let xml = format!(
        "<?xml version=\"1.0\"?>{}x{}",
        "<a>".repeat(depth),
        "</a>".repeat(depth)
    );
    let err = timed(|| extract(xml.as_bytes(), Some("deep.xml"), &Limits::default())).unwrap_err();
    assert_eq!(
        err,
        ExtractError::TooDeep {
            format: Format::Xml,
            limit: 256
        }
    );

    let body = format!(
        "<w:document><w:body>{}{}</w:body></w:document>",
        "<w:p>".repeat(depth),
        "</w:p>".repeat(depth)
    );
    let docx = zip_of(
        &[("word/document.xml", body.as_bytes())],
        CompressionMethod::Deflated,
    );
    let err = timed(|| extract(&docx, Some("deep.docx"), &Limits::default())).unwrap_err();
    assert_eq!(
        err,
        ExtractError::TooDeep {
            format: Format::Docx,
            limit: 256
        }
    );
}

#[test]
fn billion_laughs_is_not_expanded() {
    let mut dtd = String::from("<!DOCTYPE lolz [\n<!ENTITY lol \"lol\">\n");
    for level in 1..10 {
        let previous = if level == 1 {
            "lol".to_string()
        } else {
            format!("lol{}", level - 1)
        };
        dtd.push_str(&format!(
            "<!ENTITY lol{level} \"{}\">\n",
            format!("&{previous};").repeat(10)
        ));
    }
    dtd.push_str("]>\n");
    let xml = format!("<?xml version=\"1.0\"?>\n{dtd}<lolz>before &lol9; after</lolz>");
    let doc = timed(|| extract(xml.as_bytes(), Some("lol.xml"), &Limits::default()))
        .expect("harmless text");
    assert_eq!(doc.text(), "before after");

    // The same inside an Office part.
    let body = format!("<?xml version=\"1.0\"?>{dtd}<w:document><w:body><w:p><w:r><w:t>x&lol9;y</w:t></w:r></w:p></w:body></w:document>");
    let docx = zip_of(
        &[("word/document.xml", body.as_bytes())],
        CompressionMethod::Deflated,
    );
    assert_eq!(
        extract(&docx, None, &Limits::default())
            .expect("docx")
            .text(),
        "xy"
    );
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("fixture")
}

#[test]
fn truncated_pdf_is_corrupt_or_partial_never_a_panic() {
    let full = fixture("crazyones.pdf");
    for cut in [10, 100, full.len() / 3, full.len() / 2, full.len() - 200] {
        match timed(|| extract(&full[..cut], Some("cut.pdf"), &Limits::default())) {
            Err(
                ExtractError::Corrupt {
                    format: Format::Pdf,
                    ..
                }
                | ExtractError::NoTextLayer,
            ) => {}
            Ok(doc) => assert!(doc.text().contains("Crazy"), "partial text at cut {cut}"),
            Err(other) => panic!("cut {cut}: unexpected {other}"),
        }
    }
    let err = extract(&full[..10], Some("cut.pdf"), &Limits::default()).unwrap_err();
    assert!(
        err.to_string().starts_with("pdf document is corrupt"),
        "{err}"
    );
}

/// Builds a PDF with a correct cross-reference table from object bodies (object n = bodies[n-1]).
fn pdf_from_objects(bodies: &[String]) -> Vec<u8> {
    let mut out = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (i, body) in bodies.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n{body}\nendobj\n", i + 1).as_bytes());
    }
    let xref = out.len();
    out.extend_from_slice(
        format!("xref\n0 {}\n0000000000 65535 f \n", bodies.len() + 1).as_bytes(),
    );
    for offset in offsets {
        out.extend_from_slice(format!("{offset:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            bodies.len() + 1
        )
        .as_bytes(),
    );
    out
}

fn page_content(text: &str) -> String {
    let stream = format!("BT /F1 12 Tf 72 700 Td ({text}) Tj ET");
    format!(
        "<< /Length {} >>\nstream\n{stream}\nendstream",
        stream.len()
    )
}

#[test]
fn cyclic_page_tree_terminates() {
    let font = "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"
        .to_string();
    let pdf = pdf_from_objects(&[
        "<< /Type /Catalog /Pages 2 0 R >>".into(),
        // The page tree lists itself and a page whose /Parent points back into the cycle.
        "<< /Type /Pages /Kids [2 0 R 3 0 R 2 0 R] /Count 3 /Parent 2 0 R >>".into(),
        "<< /Type /Page /Parent 2 0 R /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>"
            .into(),
        page_content("Loop page"),
        font,
    ]);
    let doc =
        timed(|| extract(&pdf, Some("cycle.pdf"), &Limits::default())).expect("the one real page");
    assert_eq!(doc.sections.len(), 1);
    assert_eq!(doc.sections[0].locator.as_deref(), Some("p. 1"));
    assert_eq!(doc.sections[0].text, "Loop page");
}

#[test]
fn self_referencing_form_xobject_terminates() {
    let form = "BT /F1 12 Tf 72 700 Td (inside) Tj ET /X1 Do";
    let pdf = pdf_from_objects(&[
        "<< /Type /Catalog /Pages 2 0 R >>".into(),
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".into(),
        "<< /Type /Page /Parent 2 0 R /Contents 4 0 R /Resources 6 0 R >>".into(),
        "<< /Length 6 >>\nstream\n/X1 Do\nendstream".into(),
        format!("<< /Type /XObject /Subtype /Form /BBox [0 0 612 792] /Resources 6 0 R /Length {} >>\nstream\n{form}\nendstream", form.len()),
        "<< /Font << /F1 7 0 R >> /XObject << /X1 5 0 R >> >>".into(),
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".into(),
    ]);
    let doc =
        timed(|| extract(&pdf, Some("forms.pdf"), &Limits::default())).expect("text from the form");
    assert!(doc.text().starts_with("inside"), "{}", doc.text());
}

#[test]
fn deeply_nested_pdf_arrays_do_not_overflow_the_stack() {
    let depth = 100_000;
    let nested = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    let content = format!("BT /F1 12 Tf 72 700 Td {nested} TJ (ok) Tj ET");
    let pdf = pdf_from_objects(&[
        "<< /Type /Catalog /Pages 2 0 R >>".into(),
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".into(),
        format!("<< /Type /Page /Parent 2 0 R /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> /Junk {nested} >>"),
        format!("<< /Length {} >>\nstream\n{content}\nendstream", content.len()),
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".into(),
    ]);
    // Reaching an assertion at all means the stack held; any outcome but a panic is acceptable.
    let result = timed(|| extract(&pdf, Some("nested.pdf"), &Limits::default()));
    assert!(
        result.is_ok()
            || matches!(
                result,
                Err(ExtractError::Corrupt { .. }
                    | ExtractError::NoTextLayer
                    | ExtractError::TooDeep { .. })
            ),
        "{result:?}"
    );
}

fn pdf_with_content(content: &str) -> Vec<u8> {
    pdf_from_objects(&[
        "<< /Type /Catalog /Pages 2 0 R >>".into(),
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".into(),
        "<< /Type /Page /Parent 2 0 R /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>"
            .into(),
        format!(
            "<< /Length {} >>\nstream\n{content}\nendstream",
            content.len()
        ),
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".into(),
    ])
}

#[test]
fn a_content_stream_nested_too_deep_says_so() {
    // Red team 12: lopdf's decoder gave up on 100,000 nested dictionaries without saying why, the page read as
    // having no text, and the user was told the file needed OCR.
    let depth = 100_000;
    let content = format!(
        "BT /F1 12 Tf {}{} pop 72 700 Td (x) Tj ET",
        "<<".repeat(depth),
        ">>".repeat(depth)
    );
    let err = timed(|| {
        extract(
            &pdf_with_content(&content),
            Some("deep.pdf"),
            &Limits::default(),
        )
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            ExtractError::TooDeep {
                format: rag_extract::Format::Pdf,
                limit: 64
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("deeper than 64 levels"), "{err}");
}

#[test]
fn a_content_stream_of_ordinary_depth_is_read() {
    // A marked-content property list and a TJ array, the nesting real pages have; strings and comments holding
    // brackets do not count.
    let content =
        "/Span << /ActualText (a [ b << c) /Deep << /A [ [ 1 ] ] >> >> BDC BT /F1 12 Tf 72 700 Td \
                   [(Hello) -250 (world)] TJ ET EMC % [[[[ << <<";
    let doc = extract(
        &pdf_with_content(content),
        Some("ordinary.pdf"),
        &Limits::default(),
    )
    .unwrap();
    assert!(doc.text().contains("Hello"), "{}", doc.text());
}

#[test]
fn random_bytes_named_pdf_are_rejected() {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let random: Vec<u8> = (0..4096)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    let err = extract(&random, Some("invoice.pdf"), &Limits::default()).unwrap_err();
    assert!(
        matches!(
            err,
            ExtractError::Corrupt {
                format: Format::Pdf,
                ..
            } | ExtractError::UnsupportedFormat { .. }
        ),
        "{err}"
    );
    // A %PDF header followed by garbage is a corrupt PDF, not a panic.
    let mut fake = b"%PDF-1.7\n".to_vec();
    fake.extend_from_slice(&random);
    let err = extract(&fake, Some("invoice.pdf"), &Limits::default()).unwrap_err();
    assert!(
        matches!(
            err,
            ExtractError::Corrupt {
                format: Format::Pdf,
                ..
            } | ExtractError::NoTextLayer
        ),
        "{err}"
    );
}

#[test]
fn mismatched_name_and_content_is_handled() {
    let docx = zip_of(
        &[("word/document.xml", b"<w:document><w:body><w:p><w:r><w:t>Really a docx</w:t></w:r></w:p></w:body></w:document>")],
        CompressionMethod::Deflated,
    );
    let doc = extract(&docx, Some("report.pdf"), &Limits::default()).expect("docx content wins");
    assert_eq!(doc.format, Format::Docx);
    assert_eq!(doc.text(), "Really a docx");
    let other_zip = zip_of(&[("readme.txt", b"hi")], CompressionMethod::Stored);
    assert!(matches!(
        extract(&other_zip, Some("a.docx"), &Limits::default()),
        Err(ExtractError::Corrupt {
            format: Format::Docx,
            ..
        })
    ));
    assert!(matches!(
        extract(&other_zip, None, &Limits::default()),
        Err(ExtractError::UnsupportedFormat { .. })
    ));
}

#[test]
fn text_family_encodings() {
    let limits = Limits::default();
    assert_eq!(
        extract("Grüße".as_bytes(), Some("a.txt"), &limits)
            .unwrap()
            .text(),
        "Grüße"
    );
    let utf16: Vec<u8> = [0xFF, 0xFE]
        .into_iter()
        .chain("día,1".encode_utf16().flat_map(u16::to_le_bytes))
        .collect();
    let csv = extract(&utf16, Some("a.csv"), &limits).unwrap();
    assert_eq!((csv.format, csv.text()), (Format::Csv, "día,1".to_string()));
    let err = extract(b"caf\xE9 au lait", Some("menu.txt"), &limits).unwrap_err();
    assert!(matches!(err, ExtractError::Encoding { .. }), "{err}");
    assert!(err.to_string().contains("UTF-8"));
    let html = extract(
        b"<html><body><p>One</p><script>x()</script><p>Two</p></body></html>",
        Some("p.html"),
        &limits,
    );
    assert_eq!(html.unwrap().text(), "One\n\nTwo");
    let md = extract(b"# Head\n\nSome **bold** text", Some("r.md"), &limits).unwrap();
    assert_eq!(md.text(), "Head\n\nSome bold text");
}

/// The default limits with a text budget of `bytes`.
fn text_limited_to(bytes: usize) -> Limits {
    Limits {
        max_text_bytes: bytes,
        ..Limits::default()
    }
}

fn assert_too_large(err: &ExtractError, expected_limit: usize) {
    assert!(
        matches!(err, ExtractError::TooLarge { limit, .. } if *limit == expected_limit),
        "{err}"
    );
}

#[test]
fn a_shared_string_in_every_cell_stops_at_the_text_limit() {
    // One shared string of 100 KB referenced by 100 cells asks for 10 MB of text from a file of a few
    // kilobytes; with 1,000,000 cells (7 KB zipped) that was gigabytes, and a failed allocation aborts the server.
    let shared = format!("<sst><si><t>{}</t></si></sst>", "word ".repeat(20_000));
    let sheet = format!(
        "<worksheet><sheetData><row>{}</row></sheetData></worksheet>",
        "<c t=\"s\"><v>0</v></c>".repeat(100)
    );
    let xlsx = zip_of(
        &[
            ("[Content_Types].xml", b"<Types/>".as_slice()),
            (
                "xl/workbook.xml",
                b"<workbook><sheets/></workbook>".as_slice(),
            ),
            ("xl/sharedStrings.xml", shared.as_bytes()),
            ("xl/worksheets/sheet1.xml", sheet.as_bytes()),
        ],
        CompressionMethod::Deflated,
    );
    let limits = text_limited_to(1024 * 1024);
    let err = timed(|| extract(&xlsx, Some("cells.xlsx"), &limits)).unwrap_err();
    assert_too_large(&err, 1_048_576);
    // Under the limit the same sheet is read whole.
    let roomy = text_limited_to(16 * 1024 * 1024);
    let doc = timed(|| extract(&xlsx, Some("cells.xlsx"), &roomy)).expect("ten megabytes of text");
    assert!(doc.text().len() > 9_000_000);
}

#[test]
fn a_font_map_multiplying_each_code_stops_at_the_text_limit() {
    // The font's ToUnicode map turns code <01> into 200 letters; the page shows 100,000 such codes: 20 million
    // characters from 20 KB of PDF (with 20 million codes, 4 billion characters, and the server aborted).
    let cmap = format!(
        "/CIDInit /ProcSet findresource begin 12 dict begin begincmap /CMapName /X def \
         1 begincodespacerange <00> <FF> endcodespacerange 1 beginbfchar <01> <{}> endbfchar \
         endcmap CMapName currentdict /CMap defineresource pop end end",
        "0041".repeat(200)
    );
    let content = format!("BT /F1 12 Tf 72 700 Td ({}) Tj ET", "\u{1}".repeat(100_000));
    let pdf = pdf_from_objects(&[
        "<< /Type /Catalog /Pages 2 0 R >>".into(),
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".into(),
        "<< /Type /Page /Parent 2 0 R /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>"
            .into(),
        format!(
            "<< /Length {} >>\nstream\n{content}\nendstream",
            content.len()
        ),
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /ToUnicode 6 0 R >>".into(),
        format!("<< /Length {} >>\nstream\n{cmap}\nendstream", cmap.len()),
    ]);
    let limits = text_limited_to(1024 * 1024);
    let err = timed(|| extract(&pdf, Some("map.pdf"), &limits)).unwrap_err();
    assert_too_large(&err, 1_048_576);
}

#[test]
fn a_content_stream_of_millions_of_operands_is_refused_before_decoding() {
    // 3 million operands in one TJ array: lopdf's decoder would build an object of a hundred bytes and more for
    // each (120 MB of them, 117 KB compressed, asked for gigabytes).
    let content = format!("BT /F1 12 Tf 72 700 Td [{}] TJ ET", "1 ".repeat(3_000_000));
    let pdf = pdf_with_content(&content);
    let err = timed(|| extract(&pdf, Some("operands.pdf"), &Limits::default())).unwrap_err();
    assert_too_large(&err, 2_000_000);
}

/// A presentation and a workbook whose every entry names one and the same part: each part is read once, so a
/// small file cannot repeat one slide's or sheet's text thousands of times (an 18 kB .pptx made 63 MB of text
/// and took the ingesting backend to 1.1 GB; red teams 20 and 22).
#[test]
fn a_part_named_many_times_is_read_once() {
    const P: &str = "http://schemas.openxmlformats.org/officeDocument/2006/relationships";
    let repeated = |element: &str| -> String {
        (0..5000)
            .map(|i| element.replace("{i}", &(256 + i).to_string()))
            .collect()
    };
    let presentation = format!(
        r#"<p:presentation xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main" xmlns:r="{P}"><p:sldIdLst>{}</p:sldIdLst></p:presentation>"#,
        repeated(r#"<p:sldId id="{i}" r:id="rId1"/>"#)
    );
    let presentation_rels = format!(
        r#"<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="{P}/slide" Target="slides/slide1.xml"/></Relationships>"#
    );
    let slide = r#"<p:sld xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main" xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"><p:cSld><p:spTree><p:sp><p:txBody><a:p><a:r><a:t>The only slide.</a:t></a:r></a:p></p:txBody></p:sp></p:spTree></p:cSld></p:sld>"#;
    let deck = zip_of(
        &[
            ("ppt/presentation.xml", presentation.as_bytes()),
            (
                "ppt/_rels/presentation.xml.rels",
                presentation_rels.as_bytes(),
            ),
            ("ppt/slides/slide1.xml", slide.as_bytes()),
        ],
        CompressionMethod::Deflated,
    );
    let extracted = extract(&deck, Some("deck.pptx"), &Limits::default()).expect("extracts");
    assert_eq!(extracted.sections.len(), 1);
    assert_eq!(extracted.sections[0].text, "The only slide.");

    let workbook = format!(
        r#"<workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" xmlns:r="{P}"><sheets>{}</sheets></workbook>"#,
        repeated(r#"<sheet name="S{i}" sheetId="{i}" r:id="rId1"/>"#)
    );
    let workbook_rels = format!(
        r#"<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="{P}/worksheet" Target="worksheets/sheet1.xml"/></Relationships>"#
    );
    let sheet = r#"<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><sheetData><row r="1"><c r="A1" t="inlineStr"><is><t>alpha</t></is></c></row></sheetData></worksheet>"#;
    let book = zip_of(
        &[
            ("xl/workbook.xml", workbook.as_bytes()),
            ("xl/_rels/workbook.xml.rels", workbook_rels.as_bytes()),
            ("xl/worksheets/sheet1.xml", sheet.as_bytes()),
        ],
        CompressionMethod::Deflated,
    );
    let extracted = extract(&book, Some("book.xlsx"), &Limits::default()).expect("extracts");
    assert_eq!(extracted.sections.len(), 1);
    assert_eq!(
        extracted.sections[0].locator.as_deref(),
        Some("sheet \"S256\"")
    );
    assert_eq!(extracted.sections[0].text, "alpha");
}
