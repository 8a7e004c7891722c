//! The Rust half of `rag_watch`: checking user expressions with PostgreSQL's parser, and running the SQL
//! built from them as the table's owner in a security-restricted operation (see [`crate::security`]).
use pgrx::prelude::*;

#[pg_schema]
pub mod rag {
    use crate::security::{require_single_expression, RestrictedIdentity};
    use pgrx::prelude::*;
    use pgrx::{JsonB, PgSqlErrorCode};

    /// Raises unless `expression` is one SQL expression; NULL (an absent title or filter) passes.
    #[pg_extern(stable, parallel_safe, name = "_check_expression")]
    pub fn check_expression(expression: Option<&str>, role: &str) {
        if let Some(expression) = expression {
            require_single_expression(expression, role);
        }
    }

    /// Runs `sql` (one query returning one jsonb column, with `$1` bound to `argument`) as `role`, in a
    /// security-restricted operation, and returns its rows. The only door through which watch expressions
    /// are evaluated outside the table's own triggers: creating a watch, reindexing, status and the worker.
    /// In a background worker the query also runs under `rag.expression_timeout`. `search_path`, when given,
    /// is in force for that query alone (a reader's row check passes the reader's own); otherwise the query
    /// sees rag's (`pg_catalog, rag, pg_temp`), so `sql` names everything else with its schema either way.
    #[pg_extern(volatile, parallel_unsafe, name = "_query_as")]
    pub fn query_as(
        role: pg_sys::Oid,
        sql: &str,
        argument: default!(Option<JsonB>, "NULL"),
        search_path: default!(Option<&str>, "NULL"),
    ) -> SetOfIterator<'static, JsonB> {
        let in_worker = crate::pg::is_background_worker();
        let timeout_ms = if in_worker {
            crate::settings::EXPRESSION_TIMEOUT_MS.get()
        } else {
            0
        };
        let argument = argument.map(|JsonB(value)| value);
        let rows = PgTryBuilder::new(|| {
            let _identity = RestrictedIdentity::enter(role, timeout_ms, search_path);
            Spi::connect(|client| {
                let table = client.select(sql, None, &[argument.clone().map(JsonB).into()])?;
                table
                    .map(|row| row.get::<JsonB>(1))
                    .filter_map(|value| value.transpose())
                    .map(|value| value.map(|JsonB(value)| value))
                    .collect::<Result<Vec<_>, _>>()
            })
        })
        .catch_when(PgSqlErrorCode::ERRCODE_QUERY_CANCELED, |caught| {
            if timeout_ms > 0 && in_worker {
                crate::error::RagError::Timeout {
                    message: format!("the watch's expressions took longer than rag.expression_timeout ({timeout_ms} ms) for this row"),
                    hint: "Make the content, title or filter expression cheaper, or raise rag.expression_timeout.".to_string(),
                }
                .raise()
            }
            caught.rethrow()
        })
        .execute()
        .unwrap_or_else(|error| {
            crate::error::RagError::Spi {
                doing: "evaluating a watch expression".to_string(),
                error,
            }
            .raise()
        });
        SetOfIterator::new(rows.into_iter().map(JsonB))
    }
}
