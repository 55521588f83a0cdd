//! A model's vocabulary as llguidance sees it: every token's bytes in a trie, special tokens
//! marked with llguidance's `0xFF` prefix (as llama.cpp's `common/llguidance.cpp` builds it), the
//! end-of-generation tokens registered as the grammar's EOS set, and the model's own tokenizer
//! for the bytes a grammar forces (so forced tokens are the canonical tokenization).

use std::sync::Arc;

use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// The bytes of one token and whether it is a special (control) token.
pub struct TokenBytes {
    pub bytes: Vec<u8>,
    pub special: bool,
}

/// What llguidance needs of a vocabulary, written once for llama.cpp's model and for fakes.
pub struct Vocab {
    /// Per token id.
    pub tokens: Vec<TokenBytes>,
    /// End-of-generation tokens; the first is the primary EOS.
    pub eog: Vec<i32>,
    /// The model's tokenizer: bytes → ids, special tokens parsed, nothing added.
    pub tokenize: Box<dyn Fn(&[u8]) -> Vec<i32> + Send + Sync>,
}

struct VocabEnv {
    trie: TokTrie,
    tokenize: Box<dyn Fn(&[u8]) -> Vec<i32> + Send + Sync>,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        (self.tokenize)(s)
            .into_iter()
            .map(|t| t as TokenId)
            .collect()
    }
}

impl Vocab {
    /// The llguidance environment of this vocabulary.
    pub fn into_env(self) -> TokEnv {
        let words: Vec<Vec<u8>> = self
            .tokens
            .into_iter()
            .map(|t| {
                if t.special && !t.bytes.is_empty() {
                    let mut w = Vec::with_capacity(t.bytes.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend(t.bytes);
                    w
                } else {
                    t.bytes
                }
            })
            .collect();
        let eog: Vec<TokenId> = self.eog.iter().map(|&t| t as TokenId).collect();
        let info = TokRxInfo::new(words.len() as u32, eog.first().copied().unwrap_or(0));
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
        Arc::new(VocabEnv {
            trie,
            tokenize: self.tokenize,
        })
    }
}

impl Vocab {
    /// A vocabulary tokenized by greedy longest match over its own pieces (test models and the
    /// server's fake; a real model uses its own tokenizer).
    pub fn greedy(tokens: Vec<TokenBytes>, eog: Vec<i32>) -> Vocab {
        let pieces: Vec<(Vec<u8>, i32)> = tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.special && !t.bytes.is_empty())
            .map(|(i, t)| (t.bytes.clone(), i as i32))
            .collect();
        Vocab {
            tokens,
            eog,
            tokenize: Box::new(move |mut bytes: &[u8]| {
                let mut out = Vec::new();
                while !bytes.is_empty() {
                    let best = pieces
                        .iter()
                        .filter(|(p, _)| bytes.starts_with(p))
                        .max_by_key(|(p, _)| p.len());
                    match best {
                        Some((p, id)) => {
                            out.push(*id);
                            bytes = &bytes[p.len()..];
                        }
                        // a byte no piece starts with cannot be tokenized: skipped
                        None => bytes = &bytes[1..],
                    }
                }
                out
            }),
        }
    }

    /// Every byte a token (ids 0–255), byte 0 standing for the end-of-generation token.
    pub fn bytes() -> Vocab {
        let tokens = (0..=255u8)
            .map(|b| match b {
                0 => TokenBytes {
                    bytes: b"<eos>".to_vec(),
                    special: true,
                },
                b => TokenBytes {
                    bytes: vec![b],
                    special: false,
                },
            })
            .collect();
        Vocab::greedy(tokens, vec![0])
    }
}
