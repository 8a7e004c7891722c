//! What is known about common embedding models: the text each expects before a document and before a query
//! (from the models' own cards), so that a collection made for one of them embeds the way the model was trained.
//! An unknown model gets no prefix at all: a wrong instruction measurably hurts a model that was not trained
//! with it (all-MiniLM through Ollama found the right passage for 8 of 8 paraphrases without nomic's prefixes
//! and for 2 of 8 with them), while a missing one costs a known model little.

/// The prefixes of a known model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelPrefixes {
    /// Put before each chunk when it is embedded.
    pub document: &'static str,
    /// Put before each question when it is embedded.
    pub query: &'static str,
}

/// bge-*-en-v1.5, mxbai-embed-large and snowflake-arctic-embed share this retrieval instruction for queries,
/// and embed documents bare.
const RETRIEVAL_INSTRUCTION: &str = "Represent this sentence for searching relevant passages: ";

/// (name as matched, prefixes). Names are matched after `model_key` (lower case, no registry path or tag).
const KNOWN: &[(&str, ModelPrefixes)] = &[
    (
        "nomic-embed-text",
        ModelPrefixes {
            document: "search_document: ",
            query: "search_query: ",
        },
    ),
    (
        "nomic-embed-text-v1",
        ModelPrefixes {
            document: "search_document: ",
            query: "search_query: ",
        },
    ),
    (
        "nomic-embed-text-v1.5",
        ModelPrefixes {
            document: "search_document: ",
            query: "search_query: ",
        },
    ),
    (
        "mxbai-embed-large",
        ModelPrefixes {
            document: "",
            query: RETRIEVAL_INSTRUCTION,
        },
    ),
    (
        "mxbai-embed-large-v1",
        ModelPrefixes {
            document: "",
            query: RETRIEVAL_INSTRUCTION,
        },
    ),
    (
        "snowflake-arctic-embed",
        ModelPrefixes {
            document: "",
            query: RETRIEVAL_INSTRUCTION,
        },
    ),
    (
        "snowflake-arctic-embed2",
        ModelPrefixes {
            document: "",
            query: "query: ",
        },
    ),
    (
        "bge-small-en-v1.5",
        ModelPrefixes {
            document: "",
            query: RETRIEVAL_INSTRUCTION,
        },
    ),
    (
        "bge-base-en-v1.5",
        ModelPrefixes {
            document: "",
            query: RETRIEVAL_INSTRUCTION,
        },
    ),
    (
        "bge-large-en-v1.5",
        ModelPrefixes {
            document: "",
            query: RETRIEVAL_INSTRUCTION,
        },
    ),
    // bge-m3 takes no instruction.
    (
        "bge-m3",
        ModelPrefixes {
            document: "",
            query: "",
        },
    ),
    (
        "e5-small-v2",
        ModelPrefixes {
            document: "passage: ",
            query: "query: ",
        },
    ),
    (
        "e5-base-v2",
        ModelPrefixes {
            document: "passage: ",
            query: "query: ",
        },
    ),
    (
        "e5-large-v2",
        ModelPrefixes {
            document: "passage: ",
            query: "query: ",
        },
    ),
    (
        "multilingual-e5-small",
        ModelPrefixes {
            document: "passage: ",
            query: "query: ",
        },
    ),
    (
        "multilingual-e5-base",
        ModelPrefixes {
            document: "passage: ",
            query: "query: ",
        },
    ),
    (
        "multilingual-e5-large",
        ModelPrefixes {
            document: "passage: ",
            query: "query: ",
        },
    ),
    // Symmetric models trained without prefixes.
    (
        "all-minilm",
        ModelPrefixes {
            document: "",
            query: "",
        },
    ),
    (
        "all-minilm-l6-v2",
        ModelPrefixes {
            document: "",
            query: "",
        },
    ),
    (
        "all-minilm-l12-v2",
        ModelPrefixes {
            document: "",
            query: "",
        },
    ),
    (
        "gte-small",
        ModelPrefixes {
            document: "",
            query: "",
        },
    ),
    (
        "gte-base",
        ModelPrefixes {
            document: "",
            query: "",
        },
    ),
    (
        "gte-large",
        ModelPrefixes {
            document: "",
            query: "",
        },
    ),
    (
        "text-embedding-3-small",
        ModelPrefixes {
            document: "",
            query: "",
        },
    ),
    (
        "text-embedding-3-large",
        ModelPrefixes {
            document: "",
            query: "",
        },
    ),
    (
        "text-embedding-ada-002",
        ModelPrefixes {
            document: "",
            query: "",
        },
    ),
];

/// A model name as the table knows it: lower case, without an Ollama tag (`:latest`, `:335m`) or a
/// registry/organisation path (`BAAI/`, `sentence-transformers/`, `hf.co/…/`).
pub fn model_key(model: &str) -> String {
    let without_path = model.rsplit('/').next().unwrap_or(model);
    let without_tag = without_path.split(':').next().unwrap_or(without_path);
    without_tag.trim().to_ascii_lowercase()
}

/// The prefixes `model` expects, when it is a known model.
pub fn known_prefixes(model: &str) -> Option<ModelPrefixes> {
    let key = model_key(model);
    KNOWN
        .iter()
        .find(|(name, _)| *name == key)
        .map(|(_, prefixes)| *prefixes)
}

/// The prefixes to use for `model`: its own when known, none otherwise.
pub fn prefixes_for(model: &str) -> ModelPrefixes {
    known_prefixes(model).unwrap_or(ModelPrefixes {
        document: "",
        query: "",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_across_tags_paths_and_case() {
        assert_eq!(model_key("nomic-embed-text:latest"), "nomic-embed-text");
        assert_eq!(model_key("BAAI/bge-small-en-v1.5"), "bge-small-en-v1.5");
        assert_eq!(
            model_key("hf.co/mixedbread-ai/mxbai-embed-large-v1:Q8_0"),
            "mxbai-embed-large-v1"
        );
        assert_eq!(model_key("all-MiniLM-L6-v2"), "all-minilm-l6-v2");
    }

    #[test]
    fn each_family_gets_its_own_prefixes() {
        assert_eq!(prefixes_for("nomic-embed-text").query, "search_query: ");
        assert_eq!(
            prefixes_for("nomic-embed-text:v1.5").document,
            "search_document: "
        );
        assert_eq!(
            prefixes_for("mxbai-embed-large").query,
            RETRIEVAL_INSTRUCTION
        );
        assert_eq!(prefixes_for("mxbai-embed-large").document, "");
        assert_eq!(
            prefixes_for("BAAI/bge-small-en-v1.5").query,
            RETRIEVAL_INSTRUCTION
        );
        assert_eq!(
            prefixes_for("intfloat/e5-base-v2"),
            ModelPrefixes {
                document: "passage: ",
                query: "query: "
            }
        );
        assert_eq!(
            prefixes_for("bge-m3"),
            ModelPrefixes {
                document: "",
                query: ""
            }
        );
    }

    #[test]
    fn symmetric_and_unknown_models_get_no_prefix() {
        for model in [
            "all-minilm",
            "all-MiniLM-L6-v2",
            "text-embedding-3-small",
            "my-own-model",
            "hash-384",
        ] {
            assert_eq!(
                prefixes_for(model),
                ModelPrefixes {
                    document: "",
                    query: ""
                },
                "{model}"
            );
        }
        assert!(known_prefixes("my-own-model").is_none());
        assert!(known_prefixes("all-minilm:latest").is_some());
    }
}
