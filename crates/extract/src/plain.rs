//! Decoding of text files: UTF-8 (with or without BOM) and BOM-marked UTF-16; nothing is guessed.

use crate::ExtractError;

/// Decodes a text file. Only encodings that can be recognised with certainty are accepted: guessing a legacy
/// code page would silently store mojibake that retrieval can never match.
pub(crate) fn decode(data: &[u8]) -> Result<String, ExtractError> {
    let text = if let Some(rest) = data.strip_prefix(&[0xEF, 0xBB, 0xBF]) {
        utf8(rest)?
    } else if let Some(rest) = data.strip_prefix(&[0xFF, 0xFE]) {
        utf16(rest, u16::from_le_bytes, "UTF-16LE")?
    } else if let Some(rest) = data.strip_prefix(&[0xFE, 0xFF]) {
        utf16(rest, u16::from_be_bytes, "UTF-16BE")?
    } else {
        utf8(data)?
    };
    if let Some(pos) = text.find('\0') {
        return Err(ExtractError::Encoding {
            detail: format!("NUL character at offset {pos}; this looks like a binary file"),
        });
    }
    Ok(text)
}

fn utf8(data: &[u8]) -> Result<String, ExtractError> {
    match std::str::from_utf8(data) {
        Ok(s) => Ok(s.to_string()),
        Err(e) => Err(ExtractError::Encoding {
            detail: format!(
                "invalid UTF-8 at byte {} and no byte-order mark; only UTF-8 and UTF-16 with BOM are accepted",
                e.valid_up_to()
            ),
        }),
    }
}

fn utf16(data: &[u8], unit: fn([u8; 2]) -> u16, name: &str) -> Result<String, ExtractError> {
    if !data.len().is_multiple_of(2) {
        return Err(ExtractError::Encoding {
            detail: format!("{name} text has an odd number of bytes"),
        });
    }
    let units = data.chunks_exact(2).map(|pair| unit([pair[0], pair[1]]));
    let mut out = String::with_capacity(data.len() / 2);
    for (index, decoded) in char::decode_utf16(units).enumerate() {
        match decoded {
            Ok(c) => out.push(c),
            Err(_) => {
                return Err(ExtractError::Encoding {
                    detail: format!("{name} text has an unpaired surrogate at code unit {index}"),
                })
            }
        }
    }
    Ok(out)
}

/// Lenient decoding for XML parts inside archives: a damaged byte in one part should cost that character, not the
/// document. UTF-16 parts (allowed by the Office formats) are honoured when they carry a BOM.
pub(crate) fn decode_lossy(data: &[u8]) -> String {
    if data.starts_with(&[0xFF, 0xFE]) || data.starts_with(&[0xFE, 0xFF]) {
        if let Ok(text) = decode(data) {
            return text;
        }
    }
    let data = data.strip_prefix(&[0xEF, 0xBB, 0xBF]).unwrap_or(data);
    String::from_utf8_lossy(data).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_utf8_with_and_without_bom() {
        assert_eq!(decode("Grüße".as_bytes()).unwrap(), "Grüße");
        assert_eq!(decode(b"\xEF\xBB\xBFhi").unwrap(), "hi");
    }

    #[test]
    fn accepts_utf16_with_bom() {
        let le: Vec<u8> = [0xFF, 0xFE]
            .into_iter()
            .chain("Zoë €".encode_utf16().flat_map(u16::to_le_bytes))
            .collect();
        let be: Vec<u8> = [0xFE, 0xFF]
            .into_iter()
            .chain("Zoë €".encode_utf16().flat_map(u16::to_be_bytes))
            .collect();
        assert_eq!(decode(&le).unwrap(), "Zoë €");
        assert_eq!(decode(&be).unwrap(), "Zoë €");
    }

    #[test]
    fn rejects_latin1_nul_and_broken_utf16() {
        assert!(matches!(
            decode(b"caf\xE9"),
            Err(ExtractError::Encoding { .. })
        ));
        assert!(matches!(
            decode(b"a\0b"),
            Err(ExtractError::Encoding { .. })
        ));
        assert!(matches!(
            decode(&[0xFF, 0xFE, 0x41]),
            Err(ExtractError::Encoding { .. })
        ));
        assert!(matches!(
            decode(&[0xFF, 0xFE, 0x00, 0xD8]),
            Err(ExtractError::Encoding { .. })
        ));
    }
}
