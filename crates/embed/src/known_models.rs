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

/// How a model turns its token vectors into one vector (as its card and sentence-transformers configuration
/// say). Informative for models served elsewhere: the server pools; the in-process engine reads it from the
/// model's own `1_Pooling/config.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of the token vectors.
    Mean,
    /// The `[CLS]` token's vector.
    Cls,
    /// Not published (hosted APIs).
    Undisclosed,
}

impl Pooling {
    /// As `rag_known_models()` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Undisclosed => "undisclosed",
        }
    }
}

/// What is known about one embedding model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KnownModel {
    /// As matched, after `model_key`.
    pub name: &'static str,
    /// What goes before documents and queries.
    pub prefixes: ModelPrefixes,
    /// How the model pools.
    pub pooling: Pooling,
    /// Tokens the model reads at most (its card's maximum sequence length); a server may be set to fewer.
    pub window_tokens: u32,
    /// The cosine-distance ceiling new collections of this model get, where one was measured on this project's
    /// evaluation (BENCHMARKS.md §5); None leaves `rag.max_distance`. Bi-encoders differ widely here: bge-small's
    /// distances are compressed (answerable questions at most 0.43 on the Debian FAQ, off-domain ones from
    /// 0.45), MiniLM's are not (0.71 and 0.71).
    pub max_distance: Option<f64>,
}

/// bge-*-en-v1.5, mxbai-embed-large and snowflake-arctic-embed share this retrieval instruction for queries,
/// and embed documents bare.
const RETRIEVAL_INSTRUCTION: &str = "Represent this sentence for searching relevant passages: ";

const NOMIC: ModelPrefixes = ModelPrefixes {
    document: "search_document: ",
    query: "search_query: ",
};
const INSTRUCTED: ModelPrefixes = ModelPrefixes {
    document: "",
    query: RETRIEVAL_INSTRUCTION,
};
const E5: ModelPrefixes = ModelPrefixes {
    document: "passage: ",
    query: "query: ",
};
const NONE: ModelPrefixes = ModelPrefixes {
    document: "",
    query: "",
};

const fn model(
    name: &'static str,
    prefixes: ModelPrefixes,
    pooling: Pooling,
    window_tokens: u32,
    max_distance: Option<f64>,
) -> KnownModel {
    KnownModel {
        name,
        prefixes,
        pooling,
        window_tokens,
        max_distance,
    }
}

/// The table. Names are matched after `model_key` (lower case, no registry path or tag).
const KNOWN: &[KnownModel] = &[
    model("nomic-embed-text", NOMIC, Pooling::Mean, 8192, None),
    model("nomic-embed-text-v1", NOMIC, Pooling::Mean, 8192, None),
    model("nomic-embed-text-v1.5", NOMIC, Pooling::Mean, 8192, None),
    model("mxbai-embed-large", INSTRUCTED, Pooling::Cls, 512, None),
    model("mxbai-embed-large-v1", INSTRUCTED, Pooling::Cls, 512, None),
    model(
        "snowflake-arctic-embed",
        INSTRUCTED,
        Pooling::Cls,
        512,
        None,
    ),
    model(
        "snowflake-arctic-embed2",
        ModelPrefixes {
            document: "",
            query: "query: ",
        },
        Pooling::Cls,
        8192,
        None,
    ),
    model(
        "bge-small-en-v1.5",
        INSTRUCTED,
        Pooling::Cls,
        512,
        Some(0.44),
    ),
    model("bge-base-en-v1.5", INSTRUCTED, Pooling::Cls, 512, None),
    model("bge-large-en-v1.5", INSTRUCTED, Pooling::Cls, 512, None),
    // bge-m3 takes no instruction.
    model("bge-m3", NONE, Pooling::Cls, 8192, None),
    model("e5-small-v2", E5, Pooling::Mean, 512, None),
    model("e5-base-v2", E5, Pooling::Mean, 512, None),
    model("e5-large-v2", E5, Pooling::Mean, 512, None),
    model("multilingual-e5-small", E5, Pooling::Mean, 512, None),
    model("multilingual-e5-base", E5, Pooling::Mean, 512, None),
    model("multilingual-e5-large", E5, Pooling::Mean, 512, None),
    // Symmetric models trained without prefixes. MiniLM's 0.6 is what rag.max_distance has always been: on the
    // Debian FAQ it keeps 95 % of the answerable questions and refuses every off-domain one.
    model("all-minilm", NONE, Pooling::Mean, 256, Some(0.6)),
    model("all-minilm-l6-v2", NONE, Pooling::Mean, 256, Some(0.6)),
    model("all-minilm-l12-v2", NONE, Pooling::Mean, 256, None),
    model("gte-small", NONE, Pooling::Mean, 512, None),
    model("gte-base", NONE, Pooling::Mean, 512, None),
    model("gte-large", NONE, Pooling::Mean, 512, None),
    model(
        "text-embedding-3-small",
        NONE,
        Pooling::Undisclosed,
        8191,
        None,
    ),
    model(
        "text-embedding-3-large",
        NONE,
        Pooling::Undisclosed,
        8191,
        None,
    ),
    model(
        "text-embedding-ada-002",
        NONE,
        Pooling::Undisclosed,
        8191,
        None,
    ),
];

/// Every known model, in the table's order.
pub fn all() -> &'static [KnownModel] {
    KNOWN
}

/// What is known about `model`, when it is known.
pub fn known_model(model: &str) -> Option<&'static KnownModel> {
    let key = model_key(model);
    KNOWN.iter().find(|known| known.name == key)
}

/// A model name as the table knows it: lower case, without an Ollama tag (`:latest`, `:335m`) or a
/// registry/organisation path (`BAAI/`, `sentence-transformers/`, `hf.co/…/`).
pub fn model_key(model: &str) -> String {
    let without_path = model.rsplit('/').next().unwrap_or(model);
    let without_tag = without_path.split(':').next().unwrap_or(without_path);
    without_tag.trim().to_ascii_lowercase()
}

/// The prefixes `model` expects, when it is a known model.
pub fn known_prefixes(model: &str) -> Option<ModelPrefixes> {
    known_model(model).map(|known| known.prefixes)
}

/// The prefixes to use for `model`: its own when known, none otherwise.
pub fn prefixes_for(model: &str) -> ModelPrefixes {
    known_prefixes(model).unwrap_or(NONE)
}

/// The distance ceiling measured for `model`, if any.
pub fn default_max_distance(model: &str) -> Option<f64> {
    known_model(model).and_then(|known| known.max_distance)
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
    fn ceilings_only_where_measured() {
        assert_eq!(default_max_distance("all-MiniLM-L6-v2"), Some(0.6));
        assert_eq!(default_max_distance("all-minilm:latest"), Some(0.6));
        assert_eq!(default_max_distance("BAAI/bge-small-en-v1.5"), Some(0.44));
        assert_eq!(default_max_distance("nomic-embed-text"), None);
        assert_eq!(default_max_distance("my-own-model"), None);
    }

    #[test]
    fn windows_and_pooling_follow_the_cards() {
        let minilm = known_model("sentence-transformers/all-MiniLM-L6-v2").unwrap();
        assert_eq!((minilm.window_tokens, minilm.pooling), (256, Pooling::Mean));
        let bge = known_model("bge-small-en-v1.5").unwrap();
        assert_eq!((bge.window_tokens, bge.pooling), (512, Pooling::Cls));
        assert_eq!(
            known_model("nomic-embed-text:v1.5").unwrap().window_tokens,
            8192
        );
        assert_eq!(
            known_model("text-embedding-3-small").unwrap().pooling,
            Pooling::Undisclosed
        );
        assert!(known_model("hash-384").is_none());
    }

    #[test]
    fn every_name_is_a_key_and_appears_once() {
        for known in all() {
            assert_eq!(model_key(known.name), known.name);
            assert_eq!(all().iter().filter(|k| k.name == known.name).count(), 1);
            assert!(known.max_distance.is_none_or(|d| d > 0.0 && d <= 2.0));
            assert!(known.window_tokens >= 256);
        }
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
