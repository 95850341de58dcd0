// Tokenizers for the model runtime: text <-> token ids.
//
// - ByteTokenizer: ids 0..255 are the bytes themselves, optionally followed by BOS and EOS, for
//   the small models we train ourselves.
// - BpeTokenizer: a HuggingFace `tokenizer.json` whose model is BPE: byte-level (GPT-2 style, as
//   used by the paper's SmolLM/Llama-style checkpoints with vocab 49152, and Llama 3) or
//   SentencePiece-style with byte fallback (Llama 2).
// - load_tokenizer(model_dir): the tokenizer a model directory ships with.
//
// encode() never adds BOS/EOS (HF's `add_special_tokens=False`): callers put bos_to_add() in
// front of a text the model reads. All errors throw twell::Error with a one-line message.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace twell::model {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The bytes the ids stand for, concatenated. Throws for an id outside [0, vocab_size()); an id in a
  // gap of a tokenizer's ids (none of its tokens has it) adds nothing, as in HF's decode.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;

  // One past the largest id the tokenizer can produce or decode.
  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
  // The token HF puts in front of a text (add_special_tokens=True), if any: BOS for Llama 2 and
  // 3, none for GPT-2-style tokenizers (SmolLM, the paper's), even when they name a bos_token.
  virtual std::optional<int32_t> bos_to_add() const = 0;
  // The token HF puts after a text (add_special_tokens=True), if any: none for Llama 2 and 3. A
  // text scored as a whole (twell eval) ends with it; a prompt to continue does not.
  virtual std::optional<int32_t> eos_to_add() const { return std::nullopt; }

  // The vocabulary entry of `id` as stored (for BPE: the byte-level form, e.g. "Ġthe").
  // Throws for an unknown id.
  virtual std::string id_to_token(int32_t id) const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  // The ids HF's decode(skip_special_tokens=True) leaves out, ascending: the added tokens marked special,
  // BOS and EOS, and the tokens tokenizer_config.json makes special (BpeTokenizer::add_special_ids).
  // `twell run --skip-special-tokens`.
  virtual std::vector<int32_t> special_ids() const = 0;
};

// Ids 0..255 are bytes; BOS (if any) is 256 and EOS (if any) comes after it. Any byte string,
// including invalid UTF-8, round-trips. decode() skips BOS/EOS; their tokens are "<bos>"/"<eos>".
class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(bool with_bos = false, bool with_eos = false);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::optional<int32_t> eos_id() const override { return eos_; }
  std::optional<int32_t> bos_to_add() const override { return bos_; }
  std::string id_to_token(int32_t id) const override;
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  std::vector<int32_t> special_ids() const override;

 private:
  std::optional<int32_t> bos_, eos_;
  int32_t vocab_size_;
};

// Byte-level BPE from a HuggingFace tokenizer.json. Supported:
//   model        {"type": "BPE"} with "vocab", "merges" ("a b" strings or ["a", "b"] pairs),
//                "ignore_merges", "unk_token"/"fuse_unk"; dropout must be null or 0 and
//                continuing_subword_prefix / end_of_word_suffix null or empty.
//   normalizer   null; or Llama 2's Sequence[Prepend "▁", Replace " " -> "▁"] with no
//                pre-tokenizer and its decoder Sequence[Replace "▁" -> " ", ByteFallback, Fuse,
//                Strip one leading space] (SentencePiece-style BPE: characters are the initial
//                symbols, "byte_fallback" turns a character with no token into <0xHH> tokens).
//   pre_tokenizer ByteLevel (add_prefix_space, use_regex), or a Sequence of Digits
//                (individual_digits) and ByteLevel, as SmolLM ships, or a Sequence of Split
//                with the Llama-3 regex (Isolated) and ByteLevel (use_regex false), as Llama 3
//                ships; any other Split pattern is refused by name. Or, with no normalizer, the
//                SentencePiece-style BPE in the newer layout (Mistral's, Llama 2's converted with
//                legacy = false): Metaspace ("▁", split false, prepend_scheme first/always/never).
//   decoder      ByteLevel (or null); Llama 2's, with its normalizer or the Metaspace pre-tokenizer.
//   added_tokens matched verbatim before pre-tokenization, leftmost-longest, honouring
//                lstrip/rstrip/single_word; "normalized": false tokens first, as HF does.
//   post_processor null, ByteLevel, or TemplateProcessing (alone or in a Sequence) with at most one
//                special token before the text (bos_to_add()) and one after it (eos_to_add());
//                encode() adds neither. Padding and truncation are ignored.
//
// Matches HF `tokenizers` 0.23 id for id on the fixtures and on 5000 random mixed-script texts
// (the Llama-3 split on another 4000, with upper-case contractions, newline runs and digit runs;
// the Llama-2 style on 4000 more, with byte fallback and special tokens inside the text)
// (the letter/number classes of the split regex, and the word characters beside single_word added
// tokens, are tables probed from `tokenizers` itself, Unicode 16). Known differences: decode()
// returns raw bytes where HF replaces invalid UTF-8 with U+FFFD (so a token sequence cut inside a
// character still concatenates correctly); text that is not valid UTF-8 (which HF cannot take) is
// encoded byte for byte, each bad byte as a code point of class "other"; with byte fallback and a
// vocabulary missing some <0xHH> tokens (no SentencePiece vocabulary does), a character with no token
// before one that falls back gives <unk> first, where HF puts it after the bytes; "decoder": null decodes
// as ByteLevel, where HF joins the raw tokens with spaces.
class BpeTokenizer final : public Tokenizer {
 public:
  static std::unique_ptr<BpeTokenizer> from_file(const std::string& path);
  // `source` names the text in error messages.
  static std::unique_ptr<BpeTokenizer> from_json(std::string_view json,
                                                 const std::string& source = "tokenizer.json");

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::optional<int32_t> eos_id() const override { return eos_; }
  std::optional<int32_t> bos_to_add() const override { return bos_to_add_; }
  std::optional<int32_t> eos_to_add() const override { return eos_to_add_; }
  std::string id_to_token(int32_t id) const override;
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  std::vector<int32_t> special_ids() const override;

  // tokenizer.json names only the tokens its post-processor puts around a text (bos_id() and
  // bos_to_add() start as the first, eos_to_add() as the last); tokenizer_config.json names BOS
  // and EOS, and add_bos_token and add_eos_token say whether each is added (absent: as the
  // post-processor does). load_tokenizer sets them. Throws for ids outside the vocabulary.
  void set_bos_eos(std::optional<int32_t> bos, std::optional<int32_t> eos, std::optional<bool> add_bos = {},
                   std::optional<bool> add_eos = {});
  // Ids tokenizer_config.json makes special beyond tokenizer.json's (its unk/pad/sep/cls/mask tokens, its
  // added_tokens_decoder entries marked special): special_ids() has them too. load_tokenizer sets them.
  void add_special_ids(const std::vector<int32_t>& ids);

  struct AddedToken {
    std::string content;
    int32_t id = 0;
    bool special = false;
    bool normalized = true;
    bool lstrip = false, rstrip = false, single_word = false;
  };
  struct PreTokenizer {
    enum class Digits { kKeep, kIndividual, kContiguous } digits = Digits::kKeep;
    bool add_prefix_space = false;
    bool use_regex = true;
    bool llama3_split = false;  // Split with the Llama-3 regex before ByteLevel
  };

 private:
  BpeTokenizer() = default;
  // Ids of one pre-tokenized piece (already in byte-level form), through the cache.
  void encode_word(const std::string& word, std::vector<int32_t>& out) const;
  std::vector<int32_t> merge_word(const std::string& word) const;
  // `at_start`: the text begins the input (Metaspace's prepend_scheme "first").
  void encode_plain(std::string_view text, bool at_start, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t> vocab_;  // model vocab + added tokens
  // Added tokens that are not in the model's vocabulary: the BPE model never makes them (a character
  // with no token of the model's falls back to bytes or unk, as in HF, even where an added token has it).
  std::unordered_set<std::string> added_only_;
  // vocab_'s entry of a model token, or end().
  std::unordered_map<std::string, int32_t>::const_iterator model_token(const std::string& s) const;
  // An id's token is tokens_[token_index_[id]], where token_index_[id] != kNoToken (tokenizer.json may
  // leave gaps): 4 bytes an id, so that ids up to 2^24 cost 64 MB, not half a gigabyte of empty strings.
  static constexpr uint32_t kNoToken = UINT32_MAX;
  std::vector<uint32_t> token_index_;
  std::vector<std::string> tokens_;
  bool has_id(int32_t id) const { return id >= 0 && id < vocab_size_ && token_index_[id] != kNoToken; }
  const std::string& token_of(int32_t id) const { return tokens_[token_index_[id]]; }  // where has_id(id)
  // Sets id's token (a new one, or in place of the one it has).
  void set_token(int32_t id, std::string token);
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::vector<AddedToken> added_;
  // With Llama 2's normalizer: the added tokens with normalized = true, their content normalized
  // as the text is, for matching in the normalized text (as HF's AddedVocabulary does).
  std::vector<AddedToken> added_metaspace_;
  PreTokenizer pre_;
  // SentencePiece-style BPE as Llama 2 ships it: "▁" for spaces and in front of the text, no
  // pre-tokenizer, characters (not bytes) as the initial symbols, <0xHH> tokens for bytes.
  bool metaspace_ = false;
  // Where the "▁" in front comes from: Llama 2's normalizer (every piece between added tokens), or,
  // as newer conversions (Mistral, Llama 2 with legacy = false) lay it out, no normalizer and a
  // Metaspace pre-tokenizer (spaces to "▁", not split) that puts it in front of a piece that has
  // none: the input's first piece ("first"), every piece ("always"), none ("never").
  enum class MetaspacePrepend { kNormalizer, kFirst, kAlways, kNever } metaspace_prepend_ = MetaspacePrepend::kNormalizer;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::optional<int32_t> unk_;
  bool fuse_unk_ = false;
  int32_t vocab_size_ = 0;
  std::optional<int32_t> bos_, eos_, bos_to_add_, eos_to_add_;
  std::vector<int32_t> more_special_;  // add_special_ids'

  // Words seen before -> their ids, as HF's BPE cache; bounded, cleared when full.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// The text of a growing sequence of ids, a piece at a time, for streaming (`twell run`, and
// python/twell through the C API's twell_text_stream): put(id) returns what decode(context + ids so
// far) has beyond what the pieces before gave, up to its last whole UTF-8 character: the bytes of a
// character split across ids wait for the id that ends it, so each piece can be shown as text on its
// own; finish() returns what is held of a character that never ended. Pieces are valid UTF-8: bytes
// that form no character (a model may draw byte tokens in any order) come as U+FFFD, one for each
// maximal ill-formed subsequence (valid_utf8), as Python's errors="replace" and HF's decode of a
// byte-level tokenizer give them (HF's ByteFallback, Llama 2's, makes every byte token of an invalid
// run U+FFFD, the valid ones among them too: [<0x4D>, <0xEE>] is "��" there, "M�" here). An id in
// `stops` (an end-of-sequence token) adds nothing. Each step decodes only a window of the last few
// ids, so a step's cost does not grow with the text. The window always begins with ids whose text was
// given already, so a decoder that treats the first token specially (Llama 2's strips
// one leading space) gives the same text as a single decode of everything, provided those ids decode
// to some text: after six ids of none (ByteTokenizer's BOS and EOS, say) such a decoder would strip
// the next token's space (no tokenizer twell loads has both).
class TextStream {
 public:
  // `context`: ids whose text is not given (a prompt); may be empty. `tok` must outlive the stream.
  TextStream(const Tokenizer& tok, std::vector<int32_t> context, std::vector<int32_t> stops = {});
  std::string put(int32_t id);
  // What is held: a start of a stop string that never went on, and a character that never ended (as
  // U+FFFD); then nothing is held.
  std::string finish();

  // Stop strings (`twell run --stop`, Python's stop_strings): the text ends just before the first
  // place where one of them appears in the new text, the stop string left out (the context's text is
  // not searched, as in vLLM and OpenAI's API; where one id completes two, the one that starts
  // earlier wins). The id that completes one sets stopped(), and put() gives nothing from then on:
  // its caller stops the generation there. Until then a piece holds back its end where that could be
  // the start of a stop string, and finish() gives what is held, as it is (a generation that ended
  // otherwise is not cut at its end). Each string non-empty and valid UTF-8 (the text is, so another
  // could never match); given before the first put().
  void stop_at(std::vector<std::string> strings);
  // The tokenizer's special_ids() add no text, in the context as in the new ids (HF's
  // decode(skip_special_tokens=True) of context + new ids past that of the context); given before the
  // first put(). The stop ids stay in the context (an ordinary token may be one).
  void skip_special_tokens();
  static void check_stop_strings(const std::vector<std::string>& strings);  // stop_at's check alone
  bool stopped() const { return stopped_index_ >= 0; }
  // The stop string met, and its index in stop_at's list ("" and -1 while none).
  std::string stopped_by() const { return stopped() ? stop_strings_[static_cast<size_t>(stopped_index_)] : ""; }
  int64_t stopped_index() const { return stopped_index_; }

 private:
  std::string cut(std::string piece);  // a piece with the stop strings applied

  static constexpr size_t kWindow = 6;  // ids of context a window keeps
  const Tokenizer& tok_;
  std::vector<int32_t> ids_, stops_;
  size_t given_;      // ids whose text has been given (or was context)
  std::string held_;  // the start of a character whose end has not come
  std::vector<std::string> stop_strings_;
  std::string pending_;     // whole characters held back: they could begin a stop string
  int64_t stopped_index_ = -1;  // the stop string that ended the text
  bool started_ = false;    // put() has been called
};

// Where `text` stops being valid UTF-8: the offset of the first byte that does not start a valid
// sequence (overlong forms, surrogates and code points past U+10FFFF included), or npos.
size_t first_invalid_utf8(std::string_view text);
// `text` with each maximal ill-formed subsequence replaced by U+FFFD (Unicode's recommended practice,
// Python's errors="replace", Rust's from_utf8_lossy); valid UTF-8 comes back as it is.
std::string valid_utf8(std::string_view text);

// `<model_dir>/tokenizer.json` as a BpeTokenizer, with BOS/EOS taken from
// tokenizer_config.json ("bos_token"/"eos_token", "add_bos_token") when that file exists.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir);
// Whether the directory has a tokenizer file at all (tokenizer.json, or SentencePiece's
// tokenizer.model, which load_tokenizer names and refuses); where not, the model may be one of
// ours with a byte vocabulary.
bool has_tokenizer_file(const std::string& model_dir);

}  // namespace twell::model
