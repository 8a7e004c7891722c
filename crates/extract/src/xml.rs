//! A flat, depth-limited XML event walker shared by every XML-based format.
//!
//! Entities: only character references and the five predefined entities are resolved. The DTD is skipped, so
//! internally declared entities (the billion-laughs attack) are never expanded; references to them are dropped.

use quick_xml::escape::resolve_predefined_entity;
use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;
use quick_xml::XmlVersion;

use crate::textbuf::TextBuilder;
use crate::{ExtractError, Format};

/// One step of a document walk. Element names are local names (namespace prefix removed): Office files use
/// conventional prefixes, but nothing obliges a producer to, so matching on local names is the robust choice.
pub(crate) enum Node<'a, 'e> {
    Open(&'e BytesStart<'a>),
    Close(&'e str),
    Text(&'e str),
}

pub(crate) fn local(name: &str) -> &str {
    name.rsplit(':').next().unwrap_or(name)
}

pub(crate) fn open_name<'s>(element: &'s BytesStart<'_>) -> &'s str {
    local(element.name().0)
}

/// The value of the attribute whose local name is `name` (first match).
pub(crate) fn attr(element: &BytesStart<'_>, name: &str) -> Option<String> {
    element
        .attributes()
        .flatten()
        .find(|a| local(a.key.0) == name && !a.key.0.starts_with("xmlns"))
        .map(|a| {
            a.normalized_value(XmlVersion::Implicit1_0)
                .map(|v| v.into_owned())
                .unwrap_or_else(|_| a.value.to_string())
        })
}

/// The value of a namespace-qualified attribute such as `r:id`, ignoring an unqualified attribute of the same
/// local name (`<p:sldId id="256" r:id="rId2"/>` has both).
pub(crate) fn qualified_attr(element: &BytesStart<'_>, name: &str) -> Option<String> {
    element
        .attributes()
        .flatten()
        .find(|a| a.key.0.contains(':') && local(a.key.0) == name && !a.key.0.starts_with("xmlns"))
        .map(|a| {
            a.normalized_value(XmlVersion::Implicit1_0)
                .map(|v| v.into_owned())
                .unwrap_or_else(|_| a.value.to_string())
        })
}

/// Walks `xml`, calling `visit` for each element start, end and piece of character data. Fails with
/// [`ExtractError::TooDeep`] as soon as nesting passes `max_depth`, and with `Corrupt` on malformed XML.
pub(crate) fn walk(
    xml: &str,
    max_depth: usize,
    format: Format,
    mut visit: impl FnMut(Node<'_, '_>),
) -> Result<(), ExtractError> {
    let mut reader = Reader::from_str(xml);
    let config = reader.config_mut();
    // Office producers are sloppy enough that a stray or misnamed end tag should not cost the whole document.
    config.check_end_names = false;
    config.allow_unmatched_ends = true;
    config.allow_dangling_amp = true;
    let mut depth = 0usize;
    loop {
        let event = reader.read_event().map_err(|e| {
            ExtractError::corrupt(
                format,
                format!("malformed XML near byte {}: {e}", reader.buffer_position()),
            )
        })?;
        match event {
            Event::Start(element) => {
                depth += 1;
                if depth > max_depth {
                    return Err(ExtractError::TooDeep {
                        format,
                        limit: max_depth,
                    });
                }
                visit(Node::Open(&element));
            }
            Event::Empty(element) => {
                if depth + 1 > max_depth {
                    return Err(ExtractError::TooDeep {
                        format,
                        limit: max_depth,
                    });
                }
                visit(Node::Open(&element));
                visit(Node::Close(open_name(&element)));
            }
            Event::End(element) => {
                depth = depth.saturating_sub(1);
                visit(Node::Close(local(element.name().0)));
            }
            Event::Text(text) => visit(Node::Text(&text)),
            Event::CData(data) => visit(Node::Text(&data)),
            Event::GeneralRef(reference) => {
                if let Ok(Some(c)) = reference.resolve_char_ref() {
                    let mut buf = [0u8; 4];
                    visit(Node::Text(c.encode_utf8(&mut buf)));
                } else if let Some(s) = resolve_predefined_entity(&reference) {
                    visit(Node::Text(s));
                }
            }
            Event::Eof => return Ok(()),
            Event::Comment(_) | Event::Decl(_) | Event::PI(_) | Event::DocType(_) => {}
        }
    }
}

/// Character data of a generic XML file. Leaf elements end a line; text inside mixed content flows on.
pub(crate) fn xml_to_text(xml: &str, max_depth: usize) -> Result<String, ExtractError> {
    let mut out = TextBuilder::new();
    // Whether each open element has had text directly inside it (mixed content).
    let mut mixed: Vec<bool> = Vec::new();
    walk(xml, max_depth, Format::Xml, |node| match node {
        Node::Open(_) => {
            out.space();
            mixed.push(false);
        }
        Node::Close(_) => {
            mixed.pop();
            if mixed.last().copied().unwrap_or(false) {
                out.space();
            } else {
                out.line_break();
            }
        }
        Node::Text(text) => {
            if !text.trim().is_empty() {
                if let Some(top) = mixed.last_mut() {
                    *top = true;
                }
            }
            out.push_text(text);
        }
    })?;
    Ok(out.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn character_data_and_predefined_entities_only() {
        let xml = r#"<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x "EXPANDED">]>
            <r><item>A &amp; B</item><item>&#x41;&#66;&x;</item><p>Hello <b>bold</b> end</p></r>"#;
        let text = xml_to_text(xml, 16).unwrap();
        assert_eq!(text, "A & B\nAB\nHello bold end");
        assert!(!text.contains("EXPANDED"));
    }

    #[test]
    fn depth_limit_is_enforced() {
        let deep = format!("{}{}", "<a>".repeat(20), "</a>".repeat(20));
        assert_eq!(
            xml_to_text(&deep, 10),
            Err(ExtractError::TooDeep {
                format: Format::Xml,
                limit: 10
            })
        );
        assert!(xml_to_text(&deep, 20).is_ok());
    }
}
