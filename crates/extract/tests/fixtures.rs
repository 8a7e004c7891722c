//! Real documents from freely licensed test suites (see tests/fixtures/README.md): known text, locators and tables.

use rag_extract::{detect_format, extract, ExtractError, Extracted, Format, Limits};

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

fn run(name: &str) -> Extracted {
    extract(&fixture(name), Some(name), &Limits::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn locators(doc: &Extracted) -> Vec<&str> {
    doc.sections
        .iter()
        .map(|s| s.locator.as_deref().unwrap_or(""))
        .collect()
}

#[test]
fn pdf_words_and_lines_stay_intact() {
    let doc = run("crazyones.pdf");
    assert_eq!(doc.format, Format::Pdf);
    assert_eq!(locators(&doc), ["p. 1"]);
    let text = doc.text();
    // The producer separates words with TJ offsets, not spaces: glued words would show here.
    assert!(
        text.starts_with("The Crazy Ones\nOctober 14, 1998\n\n"),
        "{text}"
    );
    assert!(
        text.contains("The round pegs in the square holes."),
        "{text}"
    );
    assert!(text.contains("They push the human race forward."), "{text}");
    // A ligature only the ToUnicode map knows, next to ordinary glyphs from the base encoding.
    assert!(
        text.contains("The ones who see things diﬀerently."),
        "{text}"
    );
}

#[test]
fn pdf_pages_are_numbered_locators() {
    let doc = run("two-different-pages.pdf");
    assert_eq!(locators(&doc), ["p. 1", "p. 2"]);
    assert_eq!(doc.sections[0].text, "1");
    assert_eq!(doc.sections[1].text, "2");
}

#[test]
fn pdf_text_positioned_with_td_gets_spaces_and_lines() {
    let doc = run("Sample_Td-matrix.pdf");
    assert_eq!(
        doc.text(),
        "Hello PDF! Hello PDF 200 0 Td!\n\nHello PDF 2 1! Hello PDF 10 7!"
    );
    let abc = run("inkscape-abc.pdf");
    assert_eq!(abc.text(), "A\n\nB\n\nC");
}

#[test]
fn pdf_composite_fonts_decode_through_tounicode() {
    let text = run("multilang.pdf").text();
    for expected in [
        "Hello World",
        "Привет, мир",
        "你好世界",
        "สวัสดีชาวโลก",
        "こんにちは世界",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in {text}");
    }
}

#[test]
fn pdf_encryption_with_and_without_user_password() {
    let open = run("r2-empty-password.pdf");
    assert_eq!(open.text(), "pdf encryption test\npassword: asdfzxcv");
    for locked in ["r4-user-password.pdf", "encrypted-file.pdf"] {
        let err = extract(&fixture(locked), Some(locked), &Limits::default()).unwrap_err();
        assert_eq!(
            err,
            ExtractError::Encrypted {
                format: Format::Pdf
            },
            "{locked}"
        );
        assert!(err.to_string().contains("encrypted"));
        assert!(!err.hint().is_empty());
    }
}

#[test]
fn pdf_scan_without_text_layer_needs_ocr() {
    let err = extract(
        &fixture("imagemagick-lzw.pdf"),
        Some("scan.pdf"),
        &Limits::default(),
    )
    .unwrap_err();
    assert_eq!(err, ExtractError::NoTextLayer);
    assert!(err.to_string().contains("OCR"));
}

#[test]
fn every_extraction_error_has_a_hint() {
    let empty = extract(b"", Some("empty.txt"), &Limits::default()).unwrap_err();
    assert_eq!(empty, ExtractError::Empty);
    assert!(
        empty.hint().contains("uploaded completely"),
        "{}",
        empty.hint()
    );
    let blank = extract(
        b"<html><body>  </body></html>",
        Some("blank.html"),
        &Limits::default(),
    )
    .unwrap_err();
    assert!(matches!(blank, ExtractError::NoText { .. }), "{blank}");
    assert!(
        blank.hint().contains("no text to index"),
        "{}",
        blank.hint()
    );
}

#[test]
fn pdf_page_limit_is_enforced() {
    let limits = Limits {
        max_pdf_pages: 1,
        ..Limits::default()
    };
    let err = extract(&fixture("two-different-pages.pdf"), None, &limits).unwrap_err();
    assert!(
        matches!(err, ExtractError::TooLarge { limit: 1, .. }),
        "{err}"
    );
}

#[test]
fn docx_paragraphs_tables_headers_and_footers() {
    let doc = run("blk-paras-and-tables.docx");
    assert_eq!(doc.format, Format::Docx);
    assert_eq!(locators(&doc), [""]);
    let text = doc.text();
    assert!(
        text.starts_with("Lorem ipsum dolor sit amet, consectetur adipiscing elit.\n\nText before"),
        "{text}"
    );
    assert!(text.contains("Donec semper facilisis metus finibus malesuada."));
    // Header and footer tables: cells on one line.
    assert!(text.contains("Left-side | Right-side"), "{text}");
    assert!(text.contains("Copyright | Page-number"), "{text}");

    let headers = run("hdr-header-footer.docx").text();
    assert_eq!(
        headers,
        "section with header\n\nsection without header of its own.\n\nHeader for section-1\n\nFooter for section 1"
    );
    assert_eq!(
        run("test.docx").text(),
        "python-docx was here!\n\npython-docx was here too!"
    );
}

#[test]
fn xlsx_sheets_in_workbook_order_with_names() {
    let doc = run("self_evaluation_report_2014-05-19.xlsx");
    assert_eq!(doc.format, Format::Xlsx);
    assert_eq!(locators(&doc), ["sheet \"test1\"", "sheet \"test2\""]);
    assert_eq!(doc.sections[0].text, "one\ttwo");
    assert_eq!(doc.sections[1].text, "three\tfour");

    let merged = run("merged_cells.xlsx");
    // Sheet1 has formatting only, so it carries no section.
    assert_eq!(
        locators(&merged),
        ["sheet \"Sheet2\"", "sheet \"Sheet3\"", "sheet \"Sheet4\""]
    );
    assert_eq!(merged.sections[1].text, "Foo\t\tBar\nBaz\t\tBoo");
    assert_eq!(merged.sections[2].text, "Foo\n\t\tBaz\nBar");
}

#[test]
fn pptx_slides_tables_and_notes() {
    let tables = run("tbl-cell.pptx");
    assert_eq!(tables.format, Format::Pptx);
    assert_eq!(locators(&tables), ["slide 1", "slide 2", "slide 3"]);
    assert_eq!(tables.sections[2].text, "a | b | c\nd | e | f\ng | h | i");
    assert!(tables.sections[0]
        .text
        .starts_with("having custom margins | vert anchor is inherited"));

    let text = run("txt-text.pptx");
    assert_eq!(locators(&text), ["slide 1", "slide 2"]);
    assert!(
        text.sections[0]
            .text
            .starts_with("Foo Bar\nBaz Zoo\nyahoo.com"),
        "{}",
        text.sections[0].text
    );
    assert_eq!(text.sections[1].text, "Text run in table cell");

    let notes = run("sld-notes.pptx");
    assert_eq!(locators(&notes), ["slide 1"]);
    assert_eq!(notes.sections[0].text, "Notes: Notes");
}

#[test]
fn odt_tables_headers_and_footers() {
    let table = run("simpletable.odt");
    assert_eq!(table.format, Format::Odt);
    assert_eq!(
        table.text(),
        "Cell 1 | Cell 2\nCell 3 (bold) | Cell 4 (italic)"
    );
    assert_eq!(
        run("headerfooter.odt").text(),
        "Lorem ipsum\n\nHeader 1 Test\n\nFooter 1 Bottom"
    );
}

#[test]
fn ods_sheets_are_named_locators() {
    let doc = run("chinese_spreadsheet.ods");
    assert_eq!(doc.format, Format::Ods);
    assert_eq!(locators(&doc), ["sheet \"工作表1\""]);
    assert_eq!(doc.sections[0].text, "test");
    let numbers = run("pythagoras.ods");
    assert_eq!(locators(&numbers), ["sheet \"Sheet1\""]);
    assert_eq!(numbers.sections[0].text, "3\n4\n5\n7");
}

#[test]
fn odp_slides_in_order() {
    let doc = run("ol.odp");
    assert_eq!(doc.format, Format::Odp);
    assert_eq!(locators(&doc), ["slide 1"]);
    assert!(
        doc.sections[0]
            .text
            .starts_with("OL\n\nEins\nTsvey\nDray\nFir"),
        "{}",
        doc.sections[0].text
    );
    let cols = run("cols.odp");
    assert!(cols
        .text()
        .contains("Suspendisse tempor urna dolor. Quisque eu est at augue auctor."));
}

#[test]
fn detection_ignores_a_misleading_name() {
    let docx = fixture("test.docx");
    assert_eq!(detect_format(&docx, Some("really.pdf")), Ok(Format::Docx));
    assert_eq!(
        detect_format(&fixture("crazyones.pdf"), Some("notes.txt")),
        Ok(Format::Pdf)
    );
    assert_eq!(
        detect_format(&fixture("simpletable.odt"), None),
        Ok(Format::Odt)
    );
    assert_eq!(
        detect_format(&fixture("pythagoras.ods"), Some("x.xlsx")),
        Ok(Format::Ods)
    );
    assert_eq!(detect_format(&fixture("ol.odp"), None), Ok(Format::Odp));
    assert_eq!(
        detect_format(&fixture("tbl-cell.pptx"), Some("a.docx")),
        Ok(Format::Pptx)
    );
    assert_eq!(
        detect_format(&fixture("merged_cells.xlsx"), None),
        Ok(Format::Xlsx)
    );
}
