//! Format detection. The content decides; the file name only picks among textual formats and names what a file
//! claimed to be when its content disagrees.

use crate::archive::Archive;
use crate::{ExtractError, Format, Limits};

const OLE2_MAGIC: &[u8] = &[0xD0, 0xCF, 0x11, 0xE0, 0xA1, 0xB1, 0x1A, 0xE1];

fn extension(filename: Option<&str>) -> Option<String> {
    let name = filename?.rsplit(['/', '\\']).next()?;
    let (stem, ext) = name.rsplit_once('.')?;
    if stem.is_empty() && !name.starts_with('.') {
        return None;
    }
    Some(ext.to_ascii_lowercase())
}

fn format_for_extension(ext: &str) -> Option<Format> {
    Some(match ext {
        "txt" | "text" | "log" => Format::Text,
        "md" | "markdown" => Format::Markdown,
        "csv" | "tsv" => Format::Csv,
        "json" => Format::Json,
        "xml" => Format::Xml,
        "yml" | "yaml" => Format::Yaml,
        "html" | "htm" | "xhtml" => Format::Html,
        "docx" => Format::Docx,
        "xlsx" => Format::Xlsx,
        "pptx" => Format::Pptx,
        "odt" => Format::Odt,
        "ods" => Format::Ods,
        "odp" => Format::Odp,
        "pdf" => Format::Pdf,
        _ => return None,
    })
}

fn is_binary_format(format: Format) -> bool {
    matches!(
        format,
        Format::Docx
            | Format::Xlsx
            | Format::Pptx
            | Format::Odt
            | Format::Ods
            | Format::Odp
            | Format::Pdf
    )
}

/// Signatures of common binary files that are not documents we read, so they get a precise error.
fn known_binary(data: &[u8]) -> Option<&'static str> {
    const SIGNATURES: &[(&[u8], &str)] = &[
        (b"\x89PNG\r\n\x1a\n", "PNG image"),
        (b"\xFF\xD8\xFF", "JPEG image"),
        (b"GIF8", "GIF image"),
        (b"\x1F\x8B", "gzip archive"),
        (b"7z\xBC\xAF\x27\x1C", "7-Zip archive"),
        (b"Rar!", "RAR archive"),
        (b"{\\rtf", "RTF document"),
        (b"\x7FELF", "executable"),
        (b"MZ", "executable"),
    ];
    SIGNATURES
        .iter()
        .find(|(magic, _)| data.starts_with(magic))
        .map(|(_, name)| *name)
}

pub(crate) fn detect(
    data: &[u8],
    filename: Option<&str>,
    limits: &Limits,
) -> Result<Format, ExtractError> {
    if data.is_empty() {
        return Err(ExtractError::Empty);
    }
    let ext = extension(filename);
    let hinted = ext.as_deref().and_then(format_for_extension);

    // Some producers put junk before the header; readers accept %PDF within the first kilobyte.
    let head = &data[..data.len().min(1024)];
    if head.windows(5).any(|w| w == b"%PDF-") {
        return Ok(Format::Pdf);
    }
    if data.starts_with(b"PK\x03\x04") || data.starts_with(b"PK\x05\x06") {
        return detect_zip(data, hinted, limits);
    }
    if data.starts_with(OLE2_MAGIC) {
        // Password-protected OOXML files are OLE2 containers wrapping the encrypted package.
        if let Some(format @ (Format::Docx | Format::Xlsx | Format::Pptx)) = hinted {
            return Err(ExtractError::Encrypted { format });
        }
        return Err(ExtractError::UnsupportedFormat {
            name: "legacy binary Office document (doc/xls/ppt); save it as docx/xlsx/pptx".into(),
        });
    }
    if let Some(name) = known_binary(data) {
        return Err(ExtractError::UnsupportedFormat { name: name.into() });
    }
    if let Some(format) = hinted.filter(|f| is_binary_format(*f)) {
        let detail = match format {
            Format::Pdf => "content does not start with a %PDF header",
            _ => "content is not a zip archive",
        };
        return Err(ExtractError::corrupt(format, detail));
    }
    if looks_binary(data) {
        return Err(ExtractError::UnsupportedFormat {
            name: match ext {
                Some(ext) => format!("binary data in a .{ext} file"),
                None => "binary data".into(),
            },
        });
    }
    if let Some(format) = hinted {
        return Ok(format);
    }
    Ok(sniff_text(data))
}

/// NUL bytes outside UTF-16 text, or a high share of control bytes, mean the file is not text.
fn looks_binary(data: &[u8]) -> bool {
    if data.starts_with(&[0xFF, 0xFE]) || data.starts_with(&[0xFE, 0xFF]) {
        return false;
    }
    let sample = &data[..data.len().min(8192)];
    let controls = sample
        .iter()
        .filter(|b| matches!(b, 0..=8 | 14..=26 | 28..=31))
        .count();
    sample.contains(&0) || controls * 10 > sample.len()
}

fn sniff_text(data: &[u8]) -> Format {
    let head = String::from_utf8_lossy(&data[..data.len().min(2048)]).to_ascii_lowercase();
    let trimmed = head.trim_start_matches(['\u{feff}', ' ', '\t', '\r', '\n']);
    if trimmed.starts_with("<!doctype html")
        || trimmed.starts_with("<html")
        || head.contains("<body")
    {
        Format::Html
    } else if trimmed.starts_with("<?xml") || (trimmed.starts_with('<') && trimmed.contains('>')) {
        Format::Xml
    } else if (trimmed.starts_with('{') || trimmed.starts_with('['))
        && trimmed.trim_end().ends_with([']', '}'])
        && data.len() <= 2048
    {
        Format::Json
    } else {
        Format::Text
    }
}

fn detect_zip(
    data: &[u8],
    hinted: Option<Format>,
    limits: &Limits,
) -> Result<Format, ExtractError> {
    let claimed = hinted
        .filter(|f| is_binary_format(*f) && *f != Format::Pdf)
        .unwrap_or(Format::Docx);
    let mut archive = Archive::open(data, claimed, limits)?;
    if archive.find("mimetype").is_some() {
        let mime = archive.read("mimetype")?.unwrap_or_default();
        let mime = String::from_utf8_lossy(&mime[..mime.len().min(200)])
            .trim()
            .to_string();
        let format = match mime.strip_prefix("application/vnd.oasis.opendocument.") {
            Some("text" | "text-template" | "text-master") => Some(Format::Odt),
            Some("spreadsheet" | "spreadsheet-template") => Some(Format::Ods),
            Some("presentation" | "presentation-template") => Some(Format::Odp),
            _ => None,
        };
        if let Some(format) = format {
            return Ok(format);
        }
        if mime.starts_with("application/vnd.oasis.opendocument.")
            || mime.starts_with("application/epub")
        {
            return Err(ExtractError::UnsupportedFormat { name: mime });
        }
    }
    for (part, format) in [
        ("word/document.xml", Format::Docx),
        ("xl/workbook.xml", Format::Xlsx),
        ("ppt/presentation.xml", Format::Pptx),
    ] {
        if archive.find(part).is_some() {
            return Ok(format);
        }
    }
    // Office documents may name their main part differently; [Content_Types].xml says what it is.
    if let Some(types) = archive.read_text("[Content_Types].xml")? {
        for (marker, format) in [
            ("wordprocessingml.document.main", Format::Docx),
            ("spreadsheetml.sheet.main", Format::Xlsx),
            ("presentationml.presentation.main", Format::Pptx),
        ] {
            if types.contains(marker) {
                return Ok(format);
            }
        }
    }
    match hinted {
        Some(format) if is_binary_format(format) => Err(ExtractError::corrupt(
            format,
            "zip archive does not contain the parts of this format",
        )),
        _ => Err(ExtractError::UnsupportedFormat {
            name: "zip archive".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_formats_follow_the_extension() {
        let limits = Limits::default();
        assert_eq!(
            detect(b"a,b\n1,2\n", Some("x.CSV"), &limits),
            Ok(Format::Csv)
        );
        assert_eq!(
            detect(b"# T\n", Some("dir.v2/readme.md"), &limits),
            Ok(Format::Markdown)
        );
        assert_eq!(
            detect(b"key: 1\n", Some("c.yml"), &limits),
            Ok(Format::Yaml)
        );
        assert_eq!(detect(b"plain", Some("notes"), &limits), Ok(Format::Text));
        assert_eq!(
            detect(b"<!DOCTYPE html><p>x", None, &limits),
            Ok(Format::Html)
        );
        assert_eq!(
            detect(b"<?xml version='1.0'?><a/>", None, &limits),
            Ok(Format::Xml)
        );
        assert_eq!(detect(b"{\"a\": 1}", None, &limits), Ok(Format::Json));
    }

    #[test]
    fn content_beats_a_wrong_extension() {
        let limits = Limits::default();
        assert_eq!(
            detect(b"%PDF-1.4\n...", Some("report.docx"), &limits),
            Ok(Format::Pdf)
        );
        assert!(matches!(
            detect(b"hello, I am text", Some("report.pdf"), &limits),
            Err(ExtractError::Corrupt {
                format: Format::Pdf,
                ..
            })
        ));
        assert!(matches!(
            detect(b"\x89PNG\r\n\x1a\n\0\0", Some("scan.pdf"), &limits),
            Err(ExtractError::UnsupportedFormat { .. })
        ));
        assert!(matches!(
            detect(
                &[0xD0, 0xCF, 0x11, 0xE0, 0xA1, 0xB1, 0x1A, 0xE1, 0],
                Some("locked.docx"),
                &limits
            ),
            Err(ExtractError::Encrypted {
                format: Format::Docx
            })
        ));
        assert!(matches!(
            detect(b"\x00\x01\x02\x03binary", None, &limits),
            Err(ExtractError::UnsupportedFormat { .. })
        ));
    }
}
