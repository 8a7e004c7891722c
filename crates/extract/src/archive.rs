//! Zip access with limits: the entry count is checked before any member is read, and every member is read through
//! a reader capped by the remaining decompression budget, so a zip bomb stops at the limit whatever sizes the
//! archive declares.

use std::io::{Cursor, Read};

use zip::ZipArchive;

use crate::{ExtractError, Format, Limits};

pub(crate) struct Archive<'a> {
    zip: ZipArchive<Cursor<&'a [u8]>>,
    format: Format,
    names: Vec<String>,
    budget_left: usize,
    budget: usize,
}

impl<'a> Archive<'a> {
    pub(crate) fn open(
        data: &'a [u8],
        format: Format,
        limits: &Limits,
    ) -> Result<Self, ExtractError> {
        let zip = ZipArchive::new(Cursor::new(data)).map_err(|e| {
            ExtractError::corrupt(format, format!("not a readable zip archive: {e}"))
        })?;
        if zip.len() > limits.max_archive_entries {
            return Err(ExtractError::TooLarge {
                what: format!("number of {format} archive entries"),
                limit: limits.max_archive_entries,
            });
        }
        let names = zip
            .file_names()
            .filter_map(Result::ok)
            .map(|n| n.into_owned())
            .collect();
        Ok(Archive {
            zip,
            format,
            names,
            budget_left: limits.max_decompressed_bytes,
            budget: limits.max_decompressed_bytes,
        })
    }

    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    /// The stored name matching `name`, exactly or else ignoring ASCII case (some producers write
    /// `xl/sharedstrings.xml` while the relationship says `sharedStrings.xml`).
    pub(crate) fn find(&self, name: &str) -> Option<&str> {
        let name = name.trim_start_matches('/');
        self.names
            .iter()
            .find(|n| *n == name)
            .or_else(|| self.names.iter().find(|n| n.eq_ignore_ascii_case(name)))
            .map(String::as_str)
    }

    /// Reads a member, or `Ok(None)` when there is no such member.
    pub(crate) fn read(&mut self, name: &str) -> Result<Option<Vec<u8>>, ExtractError> {
        let Some(stored) = self.find(name).map(str::to_string) else {
            return Ok(None);
        };
        let format = self.format;
        let mut member = self.zip.by_name(&stored).map_err(|e| {
            ExtractError::corrupt(format, format!("cannot open member {stored}: {e}"))
        })?;
        if member.encrypted() {
            return Err(ExtractError::Encrypted { format });
        }
        let mut content = Vec::new();
        // One byte over the budget distinguishes "exactly at the limit" from "more data follows".
        let cap = self.budget_left as u64 + 1;
        (&mut member)
            .take(cap)
            .read_to_end(&mut content)
            .map_err(|e| {
                ExtractError::corrupt(format, format!("cannot decompress member {stored}: {e}"))
            })?;
        if content.len() > self.budget_left {
            return Err(ExtractError::TooLarge {
                what: format!("decompressed {format} archive bytes"),
                limit: self.budget,
            });
        }
        self.budget_left -= content.len();
        Ok(Some(content))
    }

    /// Reads a member as text (see [`crate::plain::decode_lossy`]).
    pub(crate) fn read_text(&mut self, name: &str) -> Result<Option<String>, ExtractError> {
        Ok(self
            .read(name)?
            .map(|bytes| crate::plain::decode_lossy(&bytes)))
    }
}

/// Resolves a relationship target against the folder of the part that declares it (`ppt/` + `slides/slide1.xml`,
/// `ppt/slides/` + `../notesSlides/notesSlide1.xml`); absolute targets start at the archive root.
pub(crate) fn resolve_target(base_dir: &str, target: &str) -> String {
    let mut parts: Vec<&str> = if target.starts_with('/') {
        Vec::new()
    } else {
        base_dir.split('/').filter(|p| !p.is_empty()).collect()
    };
    for segment in target.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    parts.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relationship_targets_resolve_relative_to_the_part() {
        assert_eq!(
            resolve_target("ppt", "slides/slide1.xml"),
            "ppt/slides/slide1.xml"
        );
        assert_eq!(
            resolve_target("ppt/slides", "../notesSlides/n1.xml"),
            "ppt/notesSlides/n1.xml"
        );
        assert_eq!(
            resolve_target("xl", "/xl/worksheets/sheet1.xml"),
            "xl/worksheets/sheet1.xml"
        );
        assert_eq!(resolve_target("", "../../../etc/passwd"), "etc/passwd");
    }
}
