//! Content-table sync, the part that needs no database: `rag_watch` embeds user-written SQL expressions
//! (content, title, filter) into generated statements, so each must be exactly one expression. The database
//! then checks that it parses and type-checks against the table; this lexical check makes sure it cannot end
//! the generated statement early and smuggle in another one, whatever the parser would later say.

/// Why an expression was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpressionProblem {
    /// Empty or only whitespace.
    Empty,
    /// A `;` outside literals and quoted identifiers: a second statement.
    StatementSeparator,
    /// `--` or `/*` outside literals: a comment could hide the rest of the generated statement.
    Comment,
    /// A closing parenthesis without its opening one, which would close the wrapper around the expression.
    UnbalancedParentheses,
    /// A string, quoted identifier or dollar-quoted literal that never ends.
    UnterminatedQuote,
}

impl std::fmt::Display for ExpressionProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ExpressionProblem::Empty => "it is empty",
            ExpressionProblem::StatementSeparator => "it contains a ';' outside a literal",
            ExpressionProblem::Comment => "it contains a comment",
            ExpressionProblem::UnbalancedParentheses => "its parentheses do not balance",
            ExpressionProblem::UnterminatedQuote => "a quoted literal or identifier is not closed",
        })
    }
}

/// Accepts one SQL expression; refuses anything that could end the statement it is embedded in.
pub fn check_expression(expression: &str) -> Result<(), ExpressionProblem> {
    if expression.trim().is_empty() {
        return Err(ExpressionProblem::Empty);
    }
    let chars: Vec<char> = expression.chars().collect();
    let mut depth: i64 = 0;
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\'' | '"' => i = skip_quoted(&chars, i, chars[i])?,
            '$' => i = skip_dollar_quoted(&chars, i)?,
            ';' => return Err(ExpressionProblem::StatementSeparator),
            '-' if chars.get(i + 1) == Some(&'-') => return Err(ExpressionProblem::Comment),
            '/' if chars.get(i + 1) == Some(&'*') => return Err(ExpressionProblem::Comment),
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(ExpressionProblem::UnbalancedParentheses);
                }
            }
            _ => {}
        }
        i += 1;
    }
    if depth != 0 {
        return Err(ExpressionProblem::UnbalancedParentheses);
    }
    Ok(())
}

/// Index of the closing quote of a '...' literal or "..." identifier starting at `start` (doubled quotes
/// escape themselves; E'' strings also use backslash escapes, which are skipped conservatively).
fn skip_quoted(chars: &[char], start: usize, quote: char) -> Result<usize, ExpressionProblem> {
    let escape_string = quote == '\'' && start > 0 && matches!(chars[start - 1], 'e' | 'E');
    let mut i = start + 1;
    while i < chars.len() {
        if escape_string && chars[i] == '\\' {
            i += 2;
            continue;
        }
        if chars[i] == quote {
            if chars.get(i + 1) == Some(&quote) {
                i += 2;
                continue;
            }
            return Ok(i);
        }
        i += 1;
    }
    Err(ExpressionProblem::UnterminatedQuote)
}

/// `$tag$ ... $tag$`; a `$` that does not open a dollar quote (a parameter like `$1`) is left alone.
fn skip_dollar_quoted(chars: &[char], start: usize) -> Result<usize, ExpressionProblem> {
    let mut end = start + 1;
    while end < chars.len() && (chars[end].is_alphanumeric() || chars[end] == '_') {
        end += 1;
    }
    if end >= chars.len()
        || chars[end] != '$'
        || chars[start + 1..end]
            .first()
            .is_some_and(|c| c.is_ascii_digit())
    {
        return Ok(start);
    }
    let tag: Vec<char> = chars[start..=end].to_vec();
    let mut i = end + 1;
    while i + tag.len() <= chars.len() {
        if chars[i..i + tag.len()] == tag[..] {
            return Ok(i + tag.len() - 1);
        }
        i += 1;
    }
    Err(ExpressionProblem::UnterminatedQuote)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_expressions_pass() {
        for ok in [
            "title || E'\\n\\n' || body",
            "published",
            "coalesce(summary, left(body, 200))",
            "status = 'published' AND (lang IN ('en', 'de'))",
            "'it''s; fine'",
            "\"Odd;Column\"",
            "$$a;b$$ || $x$c--d$x$",
            "jsonb_extract_path_text(data, 'a')",
            "price * 2 - 1",
        ] {
            assert_eq!(check_expression(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn smuggled_statements_are_refused() {
        assert_eq!(
            check_expression("body); DROP TABLE users; --"),
            Err(ExpressionProblem::UnbalancedParentheses)
        );
        assert_eq!(
            check_expression("body; DELETE FROM t"),
            Err(ExpressionProblem::StatementSeparator)
        );
        assert_eq!(
            check_expression("body -- the rest"),
            Err(ExpressionProblem::Comment)
        );
        assert_eq!(
            check_expression("body /* x */"),
            Err(ExpressionProblem::Comment)
        );
        assert_eq!(
            check_expression("body) FROM t UNION SELECT (passwd"),
            Err(ExpressionProblem::UnbalancedParentheses)
        );
        assert_eq!(
            check_expression("(body"),
            Err(ExpressionProblem::UnbalancedParentheses)
        );
    }

    #[test]
    fn quotes_must_close() {
        assert_eq!(
            check_expression("'open"),
            Err(ExpressionProblem::UnterminatedQuote)
        );
        assert_eq!(
            check_expression("\"open"),
            Err(ExpressionProblem::UnterminatedQuote)
        );
        assert_eq!(
            check_expression("$tag$ open"),
            Err(ExpressionProblem::UnterminatedQuote)
        );
        assert_eq!(check_expression("E'it\\'s'"), Ok(()));
        assert_eq!(
            check_expression("E'it\\'s; x"),
            Err(ExpressionProblem::UnterminatedQuote)
        );
    }

    #[test]
    fn empty_is_refused_and_parameters_are_not_dollar_quotes() {
        assert_eq!(check_expression("  "), Err(ExpressionProblem::Empty));
        assert_eq!(check_expression("a = $1"), Ok(()));
    }
}
