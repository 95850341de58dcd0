// Tokenizers: the byte tokenizer round-trips any bytes; byte-level BPE from tokenizer.json gives
// the ids HuggingFace `tokenizers` gives (expectations in tests/model/data/bpe_expected.json,
// made by make_tokenizer_fixtures.py there), round-trips text, handles special tokens, and
// rejects what it does not support with one-line errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "core/io_test_util.h"
#include "twell/model/tokenizer.h"

namespace twell::model {
namespace {

using test::expect_error;
using test::read_file;
using test::write_file;

std::string data_path(const std::string& name) {
  return (std::filesystem::path(__FILE__).parent_path() / "data" / name).string();
}

std::string fixture_text(const std::string& name) {
  const std::string text = read_file(data_path(name));
  EXPECT_FALSE(text.empty()) << "missing fixture " << data_path(name);
  return text;
}

// `s` with bytes outside printable ASCII escaped, for failure messages.
std::string escaped(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

std::string ids_string(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  return out + "]";
}

// ---- ByteTokenizer ------------------------------------------------------------------------

TEST(ByteTokenizer, RoundTripsArbitraryBytesIncludingInvalidUtf8) {
  ByteTokenizer tok;
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  std::mt19937 rng(5);
  std::string random_bytes(1000, '\0');
  for (char& c : random_bytes) c = static_cast<char>(rng() & 0xFF);
  for (const std::string& s : {std::string(), all, std::string("\xff\xfe\xc3(\xe2\x82", 6),
                               random_bytes, std::string("caf\xc3\xa9 \xf0\x9f\x91\x8d")}) {
    const std::vector<int32_t> ids = tok.encode(s);
    ASSERT_EQ(ids.size(), s.size());
    for (size_t i = 0; i < s.size(); ++i)
      ASSERT_EQ(ids[i], static_cast<unsigned char>(s[i])) << "byte " << i;
    EXPECT_EQ(tok.decode(ids), s) << escaped(s);
  }
}

TEST(ByteTokenizer, BosEosFollowTheBytesAndDecodeSkipsThem) {
  EXPECT_EQ(ByteTokenizer().vocab_size(), 256);
  EXPECT_FALSE(ByteTokenizer().bos_id());
  ByteTokenizer eos_only(false, true);
  EXPECT_EQ(eos_only.vocab_size(), 257);
  EXPECT_EQ(eos_only.eos_id(), 256);
  ByteTokenizer tok(true, true);
  EXPECT_EQ(tok.vocab_size(), 258);
  EXPECT_EQ(tok.bos_id(), 256);
  EXPECT_EQ(tok.eos_id(), 257);
  EXPECT_EQ(tok.bos_to_add(), 256);  // our own models are trained with BOS in front
  EXPECT_EQ(tok.decode({256, 'h', 'i', 257}), "hi");
  EXPECT_EQ(tok.id_to_token(256), "<bos>");
  EXPECT_EQ(tok.id_to_token('a'), "a");
  EXPECT_EQ(tok.token_to_id("<eos>"), 257);
  EXPECT_EQ(tok.token_to_id("\xff"), 255);
  EXPECT_FALSE(tok.token_to_id("ab"));
}

TEST(ByteTokenizer, UnknownIdsAreErrors) {
  ByteTokenizer tok(true, false);
  expect_error([&] { tok.decode({'a', 257}); }, {"unknown token id 257", "position 1"});
  expect_error([&] { tok.decode({-1}); }, {"unknown token id -1"});
  expect_error([&] { tok.id_to_token(300); }, {"unknown token id 300"});
}

// ---- BpeTokenizer against HuggingFace -----------------------------------------------------

class BpeMatchesHuggingFace : public testing::TestWithParam<std::string> {};

TEST_P(BpeMatchesHuggingFace, IdsAndDecodedText) {
  const auto expected = nlohmann::json::parse(fixture_text("bpe_expected.json"));
  const auto& cases = expected.at("cases").at(GetParam());
  ASSERT_GT(cases.size(), 50u);
  auto tok = BpeTokenizer::from_file(data_path(GetParam()));
  int mismatches = 0;
  for (const auto& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    const std::vector<int32_t> want = c.at("ids").get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok->encode(text);
    if (got != want && ++mismatches <= 5)
      ADD_FAILURE() << "encode(\"" << escaped(text) << "\")\n  got  " << ids_string(got)
                    << "\n  want " << ids_string(want);
    EXPECT_EQ(tok->decode(want), c.at("decoded").get<std::string>())
        << "decode of \"" << escaped(text) << "\"";
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases.size() << " texts";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BpeMatchesHuggingFace,
                         testing::Values("bpe_gpt2.json", "bpe_smollm.json", "bpe_prefix.json", "bpe_llama3.json",
                                         "bpe_llama2.json", "bpe_llama2_metaspace.json"),
                         [](const auto& p) { return p.param.substr(4, p.param.size() - 9); });

// ---- TextStream ----------------------------------------------------------------------------

// The pieces of a stream add up to a single decode of everything past the context, for random id
// sequences (multi-byte characters split between tokens, byte-fallback ids, special tokens) on
// every fixture, Llama 2's leading-space strip included, with and without a context.
TEST(TextStream, PiecesAddUpToOneDecodeOfEverything) {
  std::vector<std::unique_ptr<Tokenizer>> toks;
  for (const char* name : {"bpe_gpt2.json", "bpe_smollm.json", "bpe_prefix.json", "bpe_llama3.json", "bpe_llama2.json",
                           "bpe_llama2_metaspace.json"})
    toks.push_back(BpeTokenizer::from_file(data_path(name)));
  toks.push_back(std::make_unique<ByteTokenizer>(true, true));
  std::mt19937 rng(3);
  for (const auto& tok : toks) {
    std::uniform_int_distribution<int32_t> any(0, tok->vocab_size() - 1);
    const std::vector<int32_t> from_text = tok->encode("caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x91\x8b ok");
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<int32_t> context, ids = trial % 2 ? from_text : std::vector<int32_t>{};
      for (int i = 0; i < trial % 5; ++i) context.push_back(any(rng));
      for (int i = 0; i < 60; ++i) ids.push_back(any(rng));
      TextStream stream(*tok, context);
      std::string pieces;
      for (int32_t id : ids) pieces += stream.put(id);
      pieces += stream.finish();
      std::vector<int32_t> all = context;
      all.insert(all.end(), ids.begin(), ids.end());
      const std::string whole = tok->decode(all), before = tok->decode(context);
      ASSERT_EQ(whole.compare(0, before.size(), before), 0);
      EXPECT_EQ(escaped(pieces), escaped(valid_utf8(whole.substr(before.size())))) << "trial " << trial;
    }
  }
}

// The ids of a UTF-8 text, a piece at a time: every piece is whole characters (each is valid UTF-8
// alone), a stop id adds nothing, and nothing is held at the end; a character cut short comes out at
// finish().
TEST(TextStream, PiecesAreWholeCharactersAndStopsAddNothing) {
  std::vector<std::unique_ptr<Tokenizer>> toks;
  for (const char* name : {"bpe_gpt2.json", "bpe_llama3.json", "bpe_llama2.json"})
    toks.push_back(BpeTokenizer::from_file(data_path(name)));
  toks.push_back(std::make_unique<ByteTokenizer>(true, true));
  const std::string text = "caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd ok \xc3\xa9\xc3\xa9";
  for (const auto& tok : toks) {
    const int32_t stop = tok->eos_id().value_or(0);
    TextStream stream(*tok, {}, {stop});
    std::string pieces;
    for (int32_t id : tok->encode(text)) {
      for (const int32_t put : {id, stop}) {
        const std::string piece = stream.put(put);
        EXPECT_EQ(first_invalid_utf8(piece), std::string_view::npos) << escaped(piece);
        if (put == stop) {
          EXPECT_EQ(piece, "");
        }
        pieces += piece;
      }
    }
    EXPECT_EQ(stream.finish(), "");
    EXPECT_EQ(escaped(pieces), escaped(text));
  }
  ByteTokenizer bytes(true, true);
  TextStream cut(bytes, {});
  for (const int32_t b : {0xF0, 0x9F, 0x91}) EXPECT_EQ(cut.put(b), "");
  EXPECT_EQ(escaped(cut.finish()), escaped("\xef\xbf\xbd"));  // one U+FFFD for the unended character
  EXPECT_EQ(cut.put('x'), "x");  // nothing held any more
  // Bytes that form no character come as U+FFFD, never raw: a lone continuation byte, a lead
  // followed by ASCII.
  EXPECT_EQ(escaped(cut.put(0x80)), escaped("\xef\xbf\xbd"));
  EXPECT_EQ(cut.put(0xC3), "");
  EXPECT_EQ(escaped(cut.put('y')), escaped("\xef\xbf\xbdy"));
  // Bytes no continuation can make whole come at once, not with the next piece: F0 80 (F0 needs a second
  // byte of 90..BF), C0 and F5 (which begin nothing); a valid prefix waits.
  EXPECT_EQ(cut.put(0xF0), "");
  EXPECT_EQ(escaped(cut.put(0x80)), escaped("\xef\xbf\xbd\xef\xbf\xbd"));
  EXPECT_EQ(escaped(cut.put(0xC0)), escaped("\xef\xbf\xbd"));
  EXPECT_EQ(escaped(cut.put(0xF5)), escaped("\xef\xbf\xbd"));
  EXPECT_EQ(cut.put(0xED), "");
  EXPECT_EQ(cut.put(0x9F), "");
  EXPECT_EQ(escaped(cut.put(0xBF)), escaped("\xed\x9f\xbf"));
  EXPECT_EQ(cut.put(0xED), "");
  EXPECT_EQ(escaped(cut.put(0xA0)), escaped("\xef\xbf\xbd\xef\xbf\xbd"));  // a surrogate's start
  EXPECT_EQ(cut.finish(), "");
}

// Stop strings: the pieces add up to the text before the first place a stop string starts, whatever
// the split of the text into tokens (random splits of bytes, a stop string across tokens, one inside a
// token, a prefix of one that does not go on), and stopped() is set by the id that completes one.
TEST(TextStream, StopStringsEndTheTextBeforeThemWhateverTheTokens) {
  ByteTokenizer bytes(true, true);
  struct Case {
    std::string text;
    std::vector<std::string> stops;
    std::string shown, by;  // by: "" where no stop string is met
  };
  const Case cases[] = {
      {"hello\n\nworld", {"\n\n"}, "hello", "\n\n"},
      {"\nworld", {"\n\n"}, "\nworld", ""},                        // not with the context's newline
      {"hello\nworld\n", {"\n\n"}, "hello\nworld\n", ""},        // a prefix at the end is given at finish()
      {"abcabd", {"abd"}, "abc", "abd"},                           // a held prefix that did not go on, then one that did
      {"xxUser: hi", {"Assistant:", "User:"}, "xx", "User:"},
      {"one two", {"two", "one t"}, "", "one t"},                  // the earliest start wins
      {"ab", {"abc", "b"}, "a", "b"},
      {"caf\xc3\xa9 ok", {"\xc3\xa9"}, "caf", "\xc3\xa9"},      // a character's bytes in separate tokens
      {"\xf0\x9f\x91\x8b!", {"\xef\xbf\xbd!"}, "\xf0\x9f\x91\x8b!", ""},
  };
  for (const Case& c : cases) {
    for (int trial = 0; trial < 2; ++trial) {  // byte tokens: a character's bytes come one at a time
      TextStream stream(bytes, {'\n'});      // the context's text is not searched
      stream.stop_at(c.stops);
      std::string shown;
      size_t completed_at = std::string::npos;  // the byte whose id set stopped()
      for (size_t i = 0; i < c.text.size(); ++i) {
        const std::string piece = stream.put(static_cast<unsigned char>(c.text[i]));
        EXPECT_EQ(first_invalid_utf8(piece), std::string::npos);
        shown += piece;
        if (stream.stopped() && completed_at == std::string::npos) completed_at = i;
        if (trial % 2 && stream.stopped()) break;  // its generation stops here; a later put gives nothing
      }
      shown += stream.finish();
      EXPECT_EQ(escaped(shown), escaped(c.shown)) << escaped(c.text) << " trial " << trial;
      EXPECT_EQ(escaped(stream.stopped_by()), escaped(c.by));
      if (!c.by.empty()) {  // the byte that ends the first occurrence of the stop string met
        EXPECT_EQ(completed_at, c.text.find(c.by) + c.by.size() - 1) << escaped(c.text);
      }
    }
  }
  // A BPE tokenizer's tokens hold several characters: the text before the stop string comes out
  // whole, the rest of the token that completed it not at all.
  const auto gpt2 = BpeTokenizer::from_file(data_path("bpe_gpt2.json"));
  const std::string text = "The quick brown fox. The lazy dog.";
  TextStream stream(*gpt2, {});
  stream.stop_at({"fox."});
  std::string shown;
  for (int32_t id : gpt2->encode(text)) {
    shown += stream.put(id);
    if (stream.stopped()) break;
  }
  EXPECT_EQ(shown + stream.finish(), "The quick brown ");
  // finish() gives what is held as it is: a generation that ended for another reason is not cut there
  // (a character that never ended, U+FFFD, completes no stop string).
  TextStream unended(bytes, {});
  unended.stop_at({"a\xef\xbf\xbd"});
  EXPECT_EQ(unended.put('a'), "");
  EXPECT_EQ(unended.put(0xC3), "");
  EXPECT_EQ(escaped(unended.finish()), escaped("a\xef\xbf\xbd"));
  EXPECT_FALSE(unended.stopped());
  // Refused: an empty stop string, one that is not UTF-8, and stop strings given after the first token.
  TextStream late(bytes, {});
  EXPECT_THROW(late.stop_at({""}), Error);
  EXPECT_THROW(late.stop_at({"\xc3"}), Error);
  late.put('a');
  EXPECT_THROW(late.stop_at({"b"}), Error);
}

// valid_utf8 replaces each maximal ill-formed subsequence by one U+FFFD, as Python's
// bytes.decode("utf-8", errors="replace") does (the expected strings are Python's).
TEST(TextStream, InvalidBytesBecomeReplacementCharactersAsPythonReplaces) {
  const std::string r = "\xef\xbf\xbd";
  const std::pair<std::string, std::string> cases[] = {
      {"", ""},
      {"abc \xc3\xa9 \xf0\x9f\x91\x8b", "abc \xc3\xa9 \xf0\x9f\x91\x8b"},  // valid: as it is
      {"\x80", r},
      {"\x80\x80", r + r},
      {"\xc3", r},
      {"\xc3x", r + "x"},
      {"\xc0\x80", r + r},                  // C0, C1 start nothing
      {"\xe0\x80\x80", r + r + r},         // E0 needs A0..BF second
      {"\xe0\xa0", r},                      // a truncated valid prefix: one
      {"\xed\xa0\x80", r + r + r},         // a surrogate: ED needs 80..9F
      {"\xed\x9f", r},
      {"\xf0\x9f\x98", r},                 // three of four bytes: one
      {"\xf0\x9f\x98x", r + "x"},
      {"\xf0\x80\x80\x80", r + r + r + r},  // F0 needs 90..BF
      {"\xf4\x90\x80\x80", r + r + r + r},  // past U+10FFFF
      {"\xf4\x8f\xbf\xbf", "\xf4\x8f\xbf\xbf"},
      {"\xf5\x80", r + r},
      {"\xff", r},
      {"a\xe4\xbd\xe5\xa5\xbd" "b", "a" + r + "\xe5\xa5\xbd" "b"},
  };
  for (const auto& [in, out] : cases) {
    EXPECT_EQ(escaped(valid_utf8(in)), escaped(out)) << escaped(in);
    EXPECT_EQ(first_invalid_utf8(valid_utf8(in)), std::string_view::npos);
  }
}

// ---- BpeTokenizer behaviour ---------------------------------------------------------------

TEST(BpeTokenizer, DecodeOfEncodeIsTheText) {
  const std::vector<std::string> texts = {
      "The quick brown fox jumps over the lazy dog.",
      "caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9 e\xcc\x81",  // accents, combining mark
      "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c \xe6\x97\xa5\xe6\x9c\xac",  // CJK
      "\xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd \xf0\x9f\x8e\x89",  // emoji, skin tone
      "a   b\t\t c  \n\n  d   ",
      "\n\n\r\n",
      "   ",
      "0123456789 3.14159 1,000,000",
      "I'm can't we'll they've he'd it's you're 'S",
      "<|endoftext|>x<|im_start|>y",
      std::string("bad \xff\xfe utf8 \xc3", 13),
      std::string("nul\0byte", 8),
  };
  for (const char* name : {"bpe_gpt2.json", "bpe_smollm.json"}) {
    auto tok = BpeTokenizer::from_file(data_path(name));
    for (const std::string& s : texts)
      EXPECT_EQ(tok->decode(tok->encode(s)), s) << name << ": " << escaped(s);
  }
}

TEST(BpeTokenizer, SpecialTokensAreMatchedVerbatimAndKeepTheirIds) {
  auto tok = BpeTokenizer::from_file(data_path("bpe_smollm.json"));
  const int32_t start = *tok->token_to_id("<|im_start|>"), end = *tok->token_to_id("<|im_end|>");
  EXPECT_EQ(tok->token_to_id("<|endoftext|>"), 0);
  EXPECT_EQ(tok->vocab_size(), end + 1);
  const std::vector<int32_t> ids = tok->encode("<|im_start|>Hello<|im_end|><|im_end|>");
  ASSERT_EQ(ids.size(), 4u) << ids_string(ids);
  EXPECT_EQ(ids[0], start);
  EXPECT_EQ(tok->id_to_token(ids[1]), "Hello");
  EXPECT_EQ(ids[2], end);
  EXPECT_EQ(ids[3], end);
  EXPECT_EQ(tok->decode(ids), "<|im_start|>Hello<|im_end|><|im_end|>");
  // A token in the vocabulary that merges cannot reach, taken whole through ignore_merges.
  EXPECT_EQ(tok->encode(" hello"), std::vector<int32_t>{*tok->token_to_id("\xc4\xa0hello")});
  EXPECT_FALSE(tok->bos_id());
}

// special_ids: what HF's decode(skip_special_tokens=True) leaves out: the added tokens marked special
// (not <word>, ' spacey' or '\n\n' of the fixture), and BOS and EOS however they were named.
TEST(BpeTokenizer, SpecialIdsAreTheSpecialAddedTokensAndBosEos) {
  auto tok = BpeTokenizer::from_file(data_path("bpe_gpt2.json"));
  EXPECT_EQ(tok->special_ids(), (std::vector<int32_t>{0, 305, 306}));
  tok->set_bos_eos(7, 306);
  EXPECT_EQ(tok->special_ids(), (std::vector<int32_t>{0, 7, 305, 306}));
  EXPECT_EQ(ByteTokenizer(true, true).special_ids(), (std::vector<int32_t>{256, 257}));
  EXPECT_EQ(ByteTokenizer(false, false).special_ids(), std::vector<int32_t>{});
}

// skip_special_tokens: the special ids add no text, in the context as in the new ids (decode of
// context + new without them, past the context's); a stop id stays in the context; refused once started.
TEST(TextStream, SkipSpecialTokensLeavesThemOut) {
  const auto tok = BpeTokenizer::from_file(data_path("bpe_gpt2.json"));
  const std::vector<int32_t> context = tok->encode("a<sep>b");
  ASSERT_NE(std::find(context.begin(), context.end(), 306), context.end());
  const std::vector<int32_t> fresh = tok->encode(" hello<mask> world<|endoftext|>!");
  const auto plain = [&](std::vector<int32_t> ids) {
    ids.erase(std::remove_if(ids.begin(), ids.end(), [](int32_t id) { return id == 0 || id == 305 || id == 306; }),
              ids.end());
    return tok->decode(ids);
  };
  TextStream stream(*tok, context);
  stream.skip_special_tokens();
  std::string text;
  for (const int32_t id : fresh) text += stream.put(id);
  text += stream.finish();
  std::vector<int32_t> all = context;
  all.insert(all.end(), fresh.begin(), fresh.end());
  EXPECT_EQ(text, plain(all).substr(plain(context).size()));
  EXPECT_EQ(text, " hello world!");
  expect_error([&] { stream.skip_special_tokens(); }, {"before the first token"});
}

TEST(BpeTokenizer, RepeatedAndLongWordsGiveStableIds) {
  auto tok = BpeTokenizer::from_file(data_path("bpe_gpt2.json"));
  const std::string text = "the cat sat on the mat the cat sat on the mat";
  const std::vector<int32_t> first = tok->encode(text);
  EXPECT_EQ(tok->encode(text), first);  // second time through the word cache
  EXPECT_EQ(tok->decode(first), text);
  // Long words go through the merge queue without the cache: "aaaa" merges into one token.
  const std::string long_word(4000, 'a');
  const std::vector<int32_t> ids = tok->encode(long_word);
  EXPECT_EQ(ids, std::vector<int32_t>(1000, *tok->token_to_id("aaaa")));
  EXPECT_EQ(tok->decode(tok->encode(std::string(5000, ' ') + "x")), std::string(5000, ' ') + "x");
}

TEST(BpeTokenizer, UnknownIdsAreErrors) {
  auto tok = BpeTokenizer::from_file(data_path("bpe_gpt2.json"));
  expect_error([&] { tok->decode({1, tok->vocab_size()}); }, {"unknown token id", "position 1"});
  expect_error([&] { tok->decode({-3}); }, {"unknown token id -3"});
  expect_error([&] { tok->id_to_token(1 << 20); }, {"unknown token id 1048576"});
  expect_error([&] { tok->set_bos_eos(tok->vocab_size(), std::nullopt); },
               {"not in the vocabulary"});
}

// ---- malformed and unsupported files -------------------------------------------------------

// The gpt2 fixture with `edit` applied.
std::string edited_fixture(const std::function<void(nlohmann::json&)>& edit) {
  auto j = nlohmann::json::parse(fixture_text("bpe_gpt2.json"));
  edit(j);
  return j.dump();
}

TEST(BpeTokenizer, MalformedFilesAreErrors) {
  using J = nlohmann::json;
  const auto load = [](const std::string& text) {
    return [text] { BpeTokenizer::from_json(text, "tok.json"); };
  };
  expect_error(load("{\"model\": "), {"tok.json", "not valid JSON"});
  expect_error(load("[1, 2]"), {"tok.json", "must be a JSON object"});
  expect_error(load("{}"), {"tok.json", "missing 'model'"});
  expect_error(load("{\"model\": {\"type\": \"BPE\"}, \"model\": {}}"), {"twice"});
  expect_error(load(edited_fixture([](J& j) { j["model"]["vocab"] = J::array(); })),
               {"'vocab' must be an object"});
  expect_error(load(edited_fixture([](J& j) { j["model"]["vocab"]["zz"] = -1; })),
               {"vocab['zz']", "integer id"});
  expect_error(load(edited_fixture([](J& j) { j["model"]["vocab"]["zz"] = 1; })),
               {"id 1 is given to both"});
  expect_error(load(edited_fixture([](J& j) { j["model"]["merges"][0] = "abc"; })),
               {"merges[0]", "not two tokens separated by one space"});
  expect_error(load(edited_fixture([](J& j) { j["model"]["merges"][1] = J::array({"h"}); })),
               {"merges[1]"});
  expect_error(load(edited_fixture([](J& j) { j["model"]["merges"][2] = "\xe2\x82\xac x"; })),
               {"merges[2]", "is not in the vocabulary"});
  expect_error(load(edited_fixture([](J& j) { j["model"].erase("merges"); })),
               {"'merges' must be an array (missing;", "splits every word into characters"});
  expect_error(load(edited_fixture([](J& j) { j["model"]["merges"] = nullptr; })), {"'merges' must be an array"});
  expect_error(load(edited_fixture([](J& j) { j["added_tokens"][0].erase("id"); })),
               {"added_tokens[0]", "'id'"});
  expect_error(load(edited_fixture([](J& j) { j["added_tokens"][1]["lstrip"] = "yes"; })),
               {"added_tokens[1]", "'lstrip' must be a boolean"});
}

// An id no token has (a gap in tokenizer.json's ids) decodes to nothing, as in HF: a model that
// draws it must not end its generation with an error.
TEST(BpeTokenizer, AGapInTheIdsDecodesToNothing) {
  const auto plain = BpeTokenizer::from_file(data_path("bpe_gpt2.json"));
  const int32_t gap = plain->vocab_size(), past = plain->vocab_size() + 3;
  const auto tok = BpeTokenizer::from_json(
      edited_fixture([&](nlohmann::json& j) { j["model"]["vocab"]["zz_past_a_gap"] = past; }), "tok.json");
  EXPECT_EQ(tok->vocab_size(), past + 1);
  const std::vector<int32_t> hi = tok->encode("hi");
  std::vector<int32_t> with_gap = hi;
  with_gap.insert(with_gap.begin() + 1, gap);
  EXPECT_EQ(tok->decode(with_gap), "hi");
  expect_error([&] { tok->id_to_token(gap); }, {"unknown token id", "a gap in tokenizer.json's ids"});
  expect_error([&] { tok->decode({past + 1}); }, {"unknown token id"});
  EXPECT_EQ(tok->id_to_token(past), "zz_past_a_gap");

  // The greatest id a tokenizer.json may give, 2^24 - 1, past a gap of 16 million: it loads (with 4 bytes
  // an id of the gap, not a string each) and decodes; an added token in place of a model token keeps its id.
  ASSERT_EQ(hi.size(), 2u);  // "h", "i"
  const int32_t last = (1 << 24) - 1, reused = hi[0];
  const auto far = BpeTokenizer::from_json(edited_fixture([&](nlohmann::json& j) {
                                             j["model"]["vocab"]["zz_far"] = last;
                                             j["added_tokens"].push_back({{"id", reused}, {"content", "<reused>"}});
                                           }),
                                           "tok.json");
  EXPECT_EQ(far->vocab_size(), last + 1);
  EXPECT_EQ(far->id_to_token(last), "zz_far");
  EXPECT_EQ(far->id_to_token(reused), "<reused>");
  EXPECT_EQ(far->decode({hi[1], last - 1, last}), tok->decode({hi[1]}) + "zz_far");
  expect_error([&] { far->id_to_token(last - 1); }, {"a gap in tokenizer.json's ids"});
}

// Llama 2's decoder turns <0xHH> tokens into bytes (its ByteFallback step) whether or not the model falls back to
// them when encoding, as HF's does (<0x+1> too: Rust's from_str_radix takes the "+"); one that only looks like
// one (<0x-1>) is text.
TEST(BpeTokenizer, ByteTokensDecodeAsBytesWithoutTheModelsByteFallback) {
  auto j = nlohmann::json::parse(fixture_text("bpe_llama2.json"));
  j["model"]["byte_fallback"] = false;
  int32_t next = 0;  // past every id, the added tokens' too
  for (const auto& [token, id] : j["model"]["vocab"].items()) next = std::max(next, id.get<int32_t>() + 1);
  for (const auto& added : j["added_tokens"]) next = std::max(next, added["id"].get<int32_t>() + 1);
  j["model"]["vocab"]["<0x+1>"] = next;
  j["model"]["vocab"]["<0x-1>"] = next + 1;
  const auto tok = BpeTokenizer::from_json(j.dump(), "tok.json");
  EXPECT_EQ(tok->decode({87, 198, 172}), "T\xc3\xa9");  // <0x54><0xC3><0xA9>: "Té"
  EXPECT_EQ(tok->decode({next}), std::string(1, '\x01'));
  EXPECT_EQ(tok->decode({next + 1}), "<0x-1>");
}

TEST(BpeTokenizer, UnsupportedComponentsAreNamed) {
  using J = nlohmann::json;
  const auto load = [](const std::string& text) {
    return [text] { BpeTokenizer::from_json(text, "tok.json"); };
  };
  expect_error(load(edited_fixture([](J& j) { j["model"]["type"] = "WordPiece"; })),
               {"unsupported model type 'WordPiece'"});
  // Metaspace: only as the newer SentencePiece layout has it (not split, with Llama 2's decoder).
  const J metaspace = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}, {"split", true}};
  expect_error(load(edited_fixture([&](J& j) { j["pre_tokenizer"] = metaspace; })),
               {"pre_tokenizer Metaspace: split = true is not supported"});
  expect_error(load(edited_fixture([&](J& j) {
                 j["pre_tokenizer"] = metaspace;
                 j["pre_tokenizer"]["split"] = false;  // but the byte-level decoder
               })),
               {"decoder must be Llama 2's", "with a Metaspace pre-tokenizer"});
  expect_error(load(edited_fixture([](J& j) {
                 j["pre_tokenizer"] = {
                     {"type", "Sequence"},
                     {"pretokenizers", J::array({{{"type", "Split"}}, j["pre_tokenizer"]})}};
               })),
               {"unsupported pre-tokenizer 'Split'"});
  expect_error(load(edited_fixture([](J& j) {  // a Split with another regex (GPT-2's, say)
                 j["pre_tokenizer"] = {
                     {"type", "Sequence"},
                     {"pretokenizers",
                      J::array({{{"type", "Split"}, {"pattern", {{"Regex", "'s|'t| ?\\p{L}+"}}}, {"behavior", "Isolated"}},
                                j["pre_tokenizer"]})}};
               })),
               {"unsupported pre-tokenizer 'Split'", "Llama-3 regex"});
  expect_error(load(edited_fixture([](J& j) { j["pre_tokenizer"] = nullptr; })),
               {"pre_tokenizer is missing"});
  expect_error(load(edited_fixture([](J& j) {
                 j["normalizer"] = {{"type", "NFC"}};
               })),
               {"unsupported normalizer 'NFC'"});
  expect_error(load(edited_fixture([](J& j) {
                 j["decoder"] = {{"type", "WordPiece"}};
               })),
               {"unsupported decoder 'WordPiece'"});
  expect_error(load(edited_fixture([](J& j) { j["model"]["dropout"] = 0.1; })), {"dropout"});
  expect_error(load(edited_fixture([](J& j) { j["model"]["continuing_subword_prefix"] = "##"; })),
               {"continuing_subword_prefix"});
}

// The token put in front of a text is the post-processor's: Llama 2's template <s>; Llama 3's
// Sequence[ByteLevel, TemplateProcessing]; none for ByteLevel (GPT-2, SmolLM). Processors that
// would add tokens twell does not add are refused by name.
TEST(BpeTokenizer, PostProcessorSaysWhichTokensGoAroundAText) {
  using J = nlohmann::json;
  const auto llama2 = BpeTokenizer::from_file(data_path("bpe_llama2.json"));
  EXPECT_EQ(llama2->bos_to_add(), 1);
  EXPECT_EQ(llama2->bos_id(), 1);
  EXPECT_FALSE(llama2->eos_id());
  const auto gpt2 = BpeTokenizer::from_file(data_path("bpe_gpt2.json"));
  EXPECT_FALSE(gpt2->bos_to_add());
  EXPECT_FALSE(gpt2->bos_id());

  const J tmpl = {{"type", "TemplateProcessing"},
                  {"single", J::array({{{"SpecialToken", {{"id", "<sep>"}, {"type_id", 0}}}},
                                       {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                  {"special_tokens", {{"<sep>", {{"id", "<sep>"}, {"ids", {306}}, {"tokens", {"<sep>"}}}}}}};
  const auto llama3_style = BpeTokenizer::from_json(edited_fixture([&](J& j) {
    j["post_processor"] = {{"type", "Sequence"}, {"processors", J::array({j["post_processor"], tmpl})}};
  }));
  EXPECT_EQ(llama3_style->bos_to_add(), 306);
  const auto text_first = BpeTokenizer::from_json(edited_fixture([&](J& j) {
    j["post_processor"] = tmpl;
    std::swap(j["post_processor"]["single"][0], j["post_processor"]["single"][1]);  // <sep> after the text
  }));
  EXPECT_FALSE(text_first->bos_to_add());
  EXPECT_EQ(text_first->eos_to_add(), 306);  // twell eval ends a text with it, as HF does
  EXPECT_EQ(text_first->eos_id(), 306);      // and run stops at it, unless tokenizer_config names another
  EXPECT_FALSE(llama3_style->eos_to_add());
  EXPECT_FALSE(llama2->eos_to_add());
  const auto both = BpeTokenizer::from_json(edited_fixture([&](J& j) {
    j["post_processor"] = tmpl;
    j["post_processor"]["single"].push_back(tmpl["single"][0]);  // <sep> text <sep>
  }));
  EXPECT_EQ(both->bos_to_add(), 306);
  EXPECT_EQ(both->eos_to_add(), 306);

  const auto load = [](const std::string& text) { return [text] { BpeTokenizer::from_json(text, "tok.json"); }; };
  expect_error(load(edited_fixture([](J& j) { j["post_processor"] = {{"type", "RobertaProcessing"}}; })),
               {"tok.json: post_processor", "unsupported post-processor 'RobertaProcessing'"});
  expect_error(load(edited_fixture([&](J& j) {
                 j["post_processor"] = tmpl;
                 j["post_processor"]["special_tokens"]["<sep>"]["ids"] = {305};
               })),
               {"the template's token '<sep>' (id 305) is not that token"});
  // More than one token on a side, or anything but the text and special tokens, is refused rather
  // than half followed.
  expect_error(load(edited_fixture([&](J& j) {
                 j["post_processor"] = tmpl;
                 j["post_processor"]["single"].insert(j["post_processor"]["single"].begin(), tmpl["single"][0]);
               })),
               {"tok.json: post_processor.single[1]", "a second special token '<sep>' before the text"});
  expect_error(load(edited_fixture([&](J& j) {
                 j["post_processor"] = tmpl;
                 j["post_processor"]["single"][0] = J::object({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
                 j["post_processor"]["single"].push_back(tmpl["single"][1]);
               })),
               {"post_processor.single[1]", "unsupported template item"});
  expect_error(load(edited_fixture([&](J& j) {
                 j["post_processor"] = tmpl;
                 j["post_processor"].erase("special_tokens");
               })),
               {"needs one id in special_tokens['<sep>'].ids"});
}

TEST(Utf8, FirstInvalidByteIsFound) {
  EXPECT_EQ(first_invalid_utf8(""), std::string_view::npos);
  EXPECT_EQ(first_invalid_utf8("plain \xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80"), std::string_view::npos);
  EXPECT_EQ(first_invalid_utf8("ab\xff"), 2u);
  EXPECT_EQ(first_invalid_utf8("a\xc0\xaf" "b"), 1u);      // overlong '/'
  EXPECT_EQ(first_invalid_utf8("xy\xed\xa0\x80"), 2u);     // a surrogate
  EXPECT_EQ(first_invalid_utf8("\xf4\x90\x80\x80"), 0u);  // past U+10FFFF
  EXPECT_EQ(first_invalid_utf8("\xe2\x82"), 0u);            // cut short
}

// ---- load_tokenizer ------------------------------------------------------------------------

class LoadTokenizer : public test::ScratchDirTest {};

TEST_F(LoadTokenizer, ReadsTokenizerJsonAndBosEosFromTheConfig) {
  write_file(path("tokenizer.json"), fixture_text("bpe_smollm.json"));
  auto plain = load_tokenizer(dir_);
  EXPECT_FALSE(plain->bos_id());
  EXPECT_EQ(plain->encode("Hello"),
            BpeTokenizer::from_file(data_path("bpe_smollm.json"))->encode("Hello"));

  write_file(
      path("tokenizer_config.json"),
      R"({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>", "special": true},
                 "added_tokens_decoder": {"0": {"content": "<|endoftext|>"}}})");
  auto tok = load_tokenizer(dir_);
  EXPECT_EQ(tok->bos_id(), tok->token_to_id("<|im_start|>"));
  EXPECT_EQ(tok->eos_id(), tok->token_to_id("<|im_end|>"));

  EXPECT_FALSE(tok->bos_to_add());  // a GPT-2-style tokenizer names a BOS but HF adds none
  write_file(path("tokenizer_config.json"), R"({"bos_token": "<|im_start|>", "add_bos_token": true})");
  EXPECT_EQ(load_tokenizer(dir_)->bos_to_add(), tok->token_to_id("<|im_start|>"));

  write_file(path("tokenizer_config.json"), R"({"bos_token": "<s>"})");
  expect_error([&] { load_tokenizer(dir_); },
               {"tokenizer_config.json", "bos_token '<s>'", "not in"});
  write_file(path("tokenizer_config.json"), R"({"add_bos_token": "yes"})");
  expect_error([&] { load_tokenizer(dir_); }, {"tokenizer_config.json", "'add_bos_token' must be true or false"});
}

// tokenizer_config.json's other named special tokens (where the vocabulary holds them) and its
// added_tokens_decoder entries marked special are special too, as transformers makes them.
TEST_F(LoadTokenizer, TheConfigsSpecialTokensAreSpecialIds) {
  write_file(path("tokenizer.json"), fixture_text("bpe_gpt2.json"));
  EXPECT_EQ(load_tokenizer(dir_)->special_ids(), (std::vector<int32_t>{0, 305, 306}));
  write_file(path("tokenizer_config.json"),
             R"({"unk_token": "Hello", "pad_token": {"content": "<|endoftext|>"}, "mask_token": "<not there>",
                 "added_tokens_decoder": {"307": {"content": "<word>", "special": true},
                                          "308": {"content": " spacey", "special": false}}})");
  auto tok = load_tokenizer(dir_);
  std::vector<int32_t> want = {0, 305, 306, *tok->token_to_id("Hello"), 307};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(tok->special_ids(), want);
}

// Llama 2's template adds <s> with no tokenizer_config.json; add_bos_token false there turns it off.
TEST_F(LoadTokenizer, AddBosTokenOverridesThePostProcessor) {
  write_file(path("tokenizer.json"), fixture_text("bpe_llama2.json"));
  EXPECT_EQ(load_tokenizer(dir_)->bos_to_add(), 1);
  write_file(path("tokenizer_config.json"), R"({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": false})");
  auto off = load_tokenizer(dir_);
  EXPECT_FALSE(off->bos_to_add());
  EXPECT_EQ(off->bos_id(), 1);
  EXPECT_EQ(off->eos_id(), 2);
  // As transformers 5: add_eos_token alone rebuilds the template with BOS off.
  write_file(path("tokenizer_config.json"), R"({"bos_token": "<s>", "add_eos_token": false})");
  EXPECT_FALSE(load_tokenizer(dir_)->bos_to_add());
  // add_eos_token true puts EOS after a text (twell eval scores it); with no EOS named, an error.
  write_file(path("tokenizer_config.json"), R"({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": true,
                                               "add_eos_token": true})");
  auto both = load_tokenizer(dir_);
  EXPECT_EQ(both->bos_to_add(), 1);
  EXPECT_EQ(both->eos_to_add(), 2);
  write_file(path("tokenizer_config.json"), R"({"bos_token": "<s>", "add_eos_token": true})");
  expect_error([&] { load_tokenizer(dir_); }, {"tokenizer_config.json", "no eos_token is named"});
}

// A Llama-family tokenizer class adds BOS by default even where tokenizer.json's post-processor
// does not; BOS to be added with no BOS token named is an error.
TEST_F(LoadTokenizer, LlamaTokenizerClassesAddBosByDefault) {
  write_file(path("tokenizer.json"), fixture_text("bpe_smollm.json"));
  write_file(path("tokenizer_config.json"), R"({"bos_token": "<|im_start|>", "tokenizer_class": "LlamaTokenizerFast"})");
  auto tok = load_tokenizer(dir_);
  EXPECT_EQ(tok->bos_to_add(), tok->token_to_id("<|im_start|>"));
  write_file(path("tokenizer_config.json"), R"({"bos_token": "<|im_start|>", "tokenizer_class": "GPT2Tokenizer"})");
  EXPECT_FALSE(load_tokenizer(dir_)->bos_to_add());
  write_file(path("tokenizer_config.json"), R"({"add_bos_token": true})");
  expect_error([&] { load_tokenizer(dir_); }, {"tokenizer_config.json", "no bos_token is named"});
}

TEST_F(LoadTokenizer, MissingTokenizerSaysWhatWasLookedFor) {
  expect_error([&] { load_tokenizer(dir_); }, {dir_, "tokenizer.json"});
  write_file(path("tokenizer.model"), "sentencepiece");
  expect_error([&] { load_tokenizer(dir_); },
               {"tokenizer.json", "tokenizer.model (SentencePiece)"});
  expect_error([&] { BpeTokenizer::from_file(path("nope.json")); }, {"nope.json", "cannot read"});
  // A directory where the file should be is said as such, not as a missing tokenizer or bad JSON.
  std::filesystem::create_directory(path("tokenizer.json"));
  expect_error([&] { load_tokenizer(dir_); }, {"tokenizer.json: not a regular file"});
  expect_error([&] { BpeTokenizer::from_file(path("tokenizer.json")); }, {"tokenizer.json: a directory, not a file"});
}

}  // namespace
}  // namespace twell::model
