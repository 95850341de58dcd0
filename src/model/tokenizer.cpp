// Tokenizers (twell/model/tokenizer.h): the byte tokenizer, and HuggingFace byte-level BPE
// read from tokenizer.json, following the `tokenizers` library step by step:
//   added tokens split out verbatim -> pre-tokenizer (Digits?, ByteLevel: GPT-2 regex split
//   and byte -> unicode mapping) -> BPE merges by rank per piece -> ids.
// Decoding maps each token's characters back to bytes (the ByteLevel decoder).
// Tests: tests/model/test_tokenizer.cpp, against ids computed by HF `tokenizers`
// (tests/model/data/make_tokenizer_fixtures.py).
#include "twell/model/tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <queue>
#include <string_view>
#include <utility>

#include "core/json_util.h"
#include "core/utf8.h"
#include "twell/error.h"

namespace twell::model {

using json = nlohmann::json;

// ---- ByteTokenizer ------------------------------------------------------------------------

ByteTokenizer::ByteTokenizer(bool with_bos, bool with_eos) {
  int32_t next = 256;
  if (with_bos) bos_ = next++;
  if (with_eos) eos_ = next++;
  vocab_size_ = next;
}

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id >= 0 && id < 256) {
      out += static_cast<char>(id);
    } else if (id != bos_ && id != eos_) {
      throw Error(str("ByteTokenizer::decode: unknown token id ", id, " at position ", i,
                      " (vocab size ", vocab_size_, ")"));
    }
  }
  return out;
}

std::string ByteTokenizer::id_to_token(int32_t id) const {
  if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
  if (id == bos_) return "<bos>";
  if (id == eos_) return "<eos>";
  throw Error(str("ByteTokenizer: unknown token id ", id, " (vocab size ", vocab_size_, ")"));
}

std::vector<int32_t> ByteTokenizer::special_ids() const {
  std::vector<int32_t> ids;
  for (const std::optional<int32_t>& id : {bos_, eos_})
    if (id) ids.push_back(*id);
  return ids;
}

std::optional<int32_t> ByteTokenizer::token_to_id(std::string_view token) const {
  if (token.size() == 1) return static_cast<unsigned char>(token[0]);
  if (token == "<bos>") return bos_;
  if (token == "<eos>") return eos_;
  return std::nullopt;
}

// ---- Unicode classes of the GPT-2 split regex ---------------------------------------------

namespace {

struct CodeRange {
  uint32_t first, last;
};

// The non-ASCII code points that HF's ByteLevel regex (Oniguruma, Unicode 16) takes as \p{L}
// and \p{N}, probed from `tokenizers` 0.23 itself by
// tests/model/data/make_tokenizer_fixtures.py --print-tables.
// clang-format off
constexpr CodeRange kLetterRanges[] = {
    {0xAA, 0xAA}, {0xB5, 0xB5}, {0xBA, 0xBA}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x2C1},
    {0x2C6, 0x2D1}, {0x2E0, 0x2E4}, {0x2EC, 0x2EC}, {0x2EE, 0x2EE}, {0x370, 0x374}, {0x376, 0x377},
    {0x37A, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C}, {0x38E, 0x3A1},
    {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556}, {0x559, 0x559}, {0x560, 0x588},
    {0x5D0, 0x5EA}, {0x5EF, 0x5F2}, {0x620, 0x64A}, {0x66E, 0x66F}, {0x671, 0x6D3}, {0x6D5, 0x6D5},
    {0x6E5, 0x6E6}, {0x6EE, 0x6EF}, {0x6FA, 0x6FC}, {0x6FF, 0x6FF}, {0x710, 0x710}, {0x712, 0x72F},
    {0x74D, 0x7A5}, {0x7B1, 0x7B1}, {0x7CA, 0x7EA}, {0x7F4, 0x7F5}, {0x7FA, 0x7FA}, {0x800, 0x815},
    {0x81A, 0x81A}, {0x824, 0x824}, {0x828, 0x828}, {0x840, 0x858}, {0x860, 0x86A}, {0x870, 0x887},
    {0x889, 0x88E}, {0x8A0, 0x8C9}, {0x904, 0x939}, {0x93D, 0x93D}, {0x950, 0x950}, {0x958, 0x961},
    {0x971, 0x980}, {0x985, 0x98C}, {0x98F, 0x990}, {0x993, 0x9A8}, {0x9AA, 0x9B0}, {0x9B2, 0x9B2},
    {0x9B6, 0x9B9}, {0x9BD, 0x9BD}, {0x9CE, 0x9CE}, {0x9DC, 0x9DD}, {0x9DF, 0x9E1}, {0x9F0, 0x9F1},
    {0x9FC, 0x9FC}, {0xA05, 0xA0A}, {0xA0F, 0xA10}, {0xA13, 0xA28}, {0xA2A, 0xA30}, {0xA32, 0xA33},
    {0xA35, 0xA36}, {0xA38, 0xA39}, {0xA59, 0xA5C}, {0xA5E, 0xA5E}, {0xA72, 0xA74}, {0xA85, 0xA8D},
    {0xA8F, 0xA91}, {0xA93, 0xAA8}, {0xAAA, 0xAB0}, {0xAB2, 0xAB3}, {0xAB5, 0xAB9}, {0xABD, 0xABD},
    {0xAD0, 0xAD0}, {0xAE0, 0xAE1}, {0xAF9, 0xAF9}, {0xB05, 0xB0C}, {0xB0F, 0xB10}, {0xB13, 0xB28},
    {0xB2A, 0xB30}, {0xB32, 0xB33}, {0xB35, 0xB39}, {0xB3D, 0xB3D}, {0xB5C, 0xB5D}, {0xB5F, 0xB61},
    {0xB71, 0xB71}, {0xB83, 0xB83}, {0xB85, 0xB8A}, {0xB8E, 0xB90}, {0xB92, 0xB95}, {0xB99, 0xB9A},
    {0xB9C, 0xB9C}, {0xB9E, 0xB9F}, {0xBA3, 0xBA4}, {0xBA8, 0xBAA}, {0xBAE, 0xBB9}, {0xBD0, 0xBD0},
    {0xC05, 0xC0C}, {0xC0E, 0xC10}, {0xC12, 0xC28}, {0xC2A, 0xC39}, {0xC3D, 0xC3D}, {0xC58, 0xC5A},
    {0xC5D, 0xC5D}, {0xC60, 0xC61}, {0xC80, 0xC80}, {0xC85, 0xC8C}, {0xC8E, 0xC90}, {0xC92, 0xCA8},
    {0xCAA, 0xCB3}, {0xCB5, 0xCB9}, {0xCBD, 0xCBD}, {0xCDD, 0xCDE}, {0xCE0, 0xCE1}, {0xCF1, 0xCF2},
    {0xD04, 0xD0C}, {0xD0E, 0xD10}, {0xD12, 0xD3A}, {0xD3D, 0xD3D}, {0xD4E, 0xD4E}, {0xD54, 0xD56},
    {0xD5F, 0xD61}, {0xD7A, 0xD7F}, {0xD85, 0xD96}, {0xD9A, 0xDB1}, {0xDB3, 0xDBB}, {0xDBD, 0xDBD},
    {0xDC0, 0xDC6}, {0xE01, 0xE30}, {0xE32, 0xE33}, {0xE40, 0xE46}, {0xE81, 0xE82}, {0xE84, 0xE84},
    {0xE86, 0xE8A}, {0xE8C, 0xEA3}, {0xEA5, 0xEA5}, {0xEA7, 0xEB0}, {0xEB2, 0xEB3}, {0xEBD, 0xEBD},
    {0xEC0, 0xEC4}, {0xEC6, 0xEC6}, {0xEDC, 0xEDF}, {0xF00, 0xF00}, {0xF40, 0xF47}, {0xF49, 0xF6C},
    {0xF88, 0xF8C}, {0x1000, 0x102A}, {0x103F, 0x103F}, {0x1050, 0x1055}, {0x105A, 0x105D},
    {0x1061, 0x1061}, {0x1065, 0x1066}, {0x106E, 0x1070}, {0x1075, 0x1081}, {0x108E, 0x108E},
    {0x10A0, 0x10C5}, {0x10C7, 0x10C7}, {0x10CD, 0x10CD}, {0x10D0, 0x10FA}, {0x10FC, 0x1248},
    {0x124A, 0x124D}, {0x1250, 0x1256}, {0x1258, 0x1258}, {0x125A, 0x125D}, {0x1260, 0x1288},
    {0x128A, 0x128D}, {0x1290, 0x12B0}, {0x12B2, 0x12B5}, {0x12B8, 0x12BE}, {0x12C0, 0x12C0},
    {0x12C2, 0x12C5}, {0x12C8, 0x12D6}, {0x12D8, 0x1310}, {0x1312, 0x1315}, {0x1318, 0x135A},
    {0x1380, 0x138F}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1401, 0x166C}, {0x166F, 0x167F},
    {0x1681, 0x169A}, {0x16A0, 0x16EA}, {0x16F1, 0x16F8}, {0x1700, 0x1711}, {0x171F, 0x1731},
    {0x1740, 0x1751}, {0x1760, 0x176C}, {0x176E, 0x1770}, {0x1780, 0x17B3}, {0x17D7, 0x17D7},
    {0x17DC, 0x17DC}, {0x1820, 0x1878}, {0x1880, 0x1884}, {0x1887, 0x18A8}, {0x18AA, 0x18AA},
    {0x18B0, 0x18F5}, {0x1900, 0x191E}, {0x1950, 0x196D}, {0x1970, 0x1974}, {0x1980, 0x19AB},
    {0x19B0, 0x19C9}, {0x1A00, 0x1A16}, {0x1A20, 0x1A54}, {0x1AA7, 0x1AA7}, {0x1B05, 0x1B33},
    {0x1B45, 0x1B4C}, {0x1B83, 0x1BA0}, {0x1BAE, 0x1BAF}, {0x1BBA, 0x1BE5}, {0x1C00, 0x1C23},
    {0x1C4D, 0x1C4F}, {0x1C5A, 0x1C7D}, {0x1C80, 0x1C8A}, {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF},
    {0x1CE9, 0x1CEC}, {0x1CEE, 0x1CF3}, {0x1CF5, 0x1CF6}, {0x1CFA, 0x1CFA}, {0x1D00, 0x1DBF},
    {0x1E00, 0x1F15}, {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57},
    {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4},
    {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2071, 0x2071},
    {0x207F, 0x207F}, {0x2090, 0x209C}, {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113},
    {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
    {0x212A, 0x212D}, {0x212F, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149}, {0x214E, 0x214E},
    {0x2183, 0x2184}, {0x2C00, 0x2CE4}, {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0x2D00, 0x2D25},
    {0x2D27, 0x2D27}, {0x2D2D, 0x2D2D}, {0x2D30, 0x2D67}, {0x2D6F, 0x2D6F}, {0x2D80, 0x2D96},
    {0x2DA0, 0x2DA6}, {0x2DA8, 0x2DAE}, {0x2DB0, 0x2DB6}, {0x2DB8, 0x2DBE}, {0x2DC0, 0x2DC6},
    {0x2DC8, 0x2DCE}, {0x2DD0, 0x2DD6}, {0x2DD8, 0x2DDE}, {0x2E2F, 0x2E2F}, {0x3005, 0x3006},
    {0x3031, 0x3035}, {0x303B, 0x303C}, {0x3041, 0x3096}, {0x309D, 0x309F}, {0x30A1, 0x30FA},
    {0x30FC, 0x30FF}, {0x3105, 0x312F}, {0x3131, 0x318E}, {0x31A0, 0x31BF}, {0x31F0, 0x31FF},
    {0x3400, 0x4DBF}, {0x4E00, 0xA48C}, {0xA4D0, 0xA4FD}, {0xA500, 0xA60C}, {0xA610, 0xA61F},
    {0xA62A, 0xA62B}, {0xA640, 0xA66E}, {0xA67F, 0xA69D}, {0xA6A0, 0xA6E5}, {0xA717, 0xA71F},
    {0xA722, 0xA788}, {0xA78B, 0xA7CD}, {0xA7D0, 0xA7D1}, {0xA7D3, 0xA7D3}, {0xA7D5, 0xA7DC},
    {0xA7F2, 0xA801}, {0xA803, 0xA805}, {0xA807, 0xA80A}, {0xA80C, 0xA822}, {0xA840, 0xA873},
    {0xA882, 0xA8B3}, {0xA8F2, 0xA8F7}, {0xA8FB, 0xA8FB}, {0xA8FD, 0xA8FE}, {0xA90A, 0xA925},
    {0xA930, 0xA946}, {0xA960, 0xA97C}, {0xA984, 0xA9B2}, {0xA9CF, 0xA9CF}, {0xA9E0, 0xA9E4},
    {0xA9E6, 0xA9EF}, {0xA9FA, 0xA9FE}, {0xAA00, 0xAA28}, {0xAA40, 0xAA42}, {0xAA44, 0xAA4B},
    {0xAA60, 0xAA76}, {0xAA7A, 0xAA7A}, {0xAA7E, 0xAAAF}, {0xAAB1, 0xAAB1}, {0xAAB5, 0xAAB6},
    {0xAAB9, 0xAABD}, {0xAAC0, 0xAAC0}, {0xAAC2, 0xAAC2}, {0xAADB, 0xAADD}, {0xAAE0, 0xAAEA},
    {0xAAF2, 0xAAF4}, {0xAB01, 0xAB06}, {0xAB09, 0xAB0E}, {0xAB11, 0xAB16}, {0xAB20, 0xAB26},
    {0xAB28, 0xAB2E}, {0xAB30, 0xAB5A}, {0xAB5C, 0xAB69}, {0xAB70, 0xABE2}, {0xAC00, 0xD7A3},
    {0xD7B0, 0xD7C6}, {0xD7CB, 0xD7FB}, {0xF900, 0xFA6D}, {0xFA70, 0xFAD9}, {0xFB00, 0xFB06},
    {0xFB13, 0xFB17}, {0xFB1D, 0xFB1D}, {0xFB1F, 0xFB28}, {0xFB2A, 0xFB36}, {0xFB38, 0xFB3C},
    {0xFB3E, 0xFB3E}, {0xFB40, 0xFB41}, {0xFB43, 0xFB44}, {0xFB46, 0xFBB1}, {0xFBD3, 0xFD3D},
    {0xFD50, 0xFD8F}, {0xFD92, 0xFDC7}, {0xFDF0, 0xFDFB}, {0xFE70, 0xFE74}, {0xFE76, 0xFEFC},
    {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0xFF66, 0xFFBE}, {0xFFC2, 0xFFC7}, {0xFFCA, 0xFFCF},
    {0xFFD2, 0xFFD7}, {0xFFDA, 0xFFDC}, {0x10000, 0x1000B}, {0x1000D, 0x10026}, {0x10028, 0x1003A},
    {0x1003C, 0x1003D}, {0x1003F, 0x1004D}, {0x10050, 0x1005D}, {0x10080, 0x100FA},
    {0x10280, 0x1029C}, {0x102A0, 0x102D0}, {0x10300, 0x1031F}, {0x1032D, 0x10340},
    {0x10342, 0x10349}, {0x10350, 0x10375}, {0x10380, 0x1039D}, {0x103A0, 0x103C3},
    {0x103C8, 0x103CF}, {0x10400, 0x1049D}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10500, 0x10527}, {0x10530, 0x10563}, {0x10570, 0x1057A}, {0x1057C, 0x1058A},
    {0x1058C, 0x10592}, {0x10594, 0x10595}, {0x10597, 0x105A1}, {0x105A3, 0x105B1},
    {0x105B3, 0x105B9}, {0x105BB, 0x105BC}, {0x105C0, 0x105F3}, {0x10600, 0x10736},
    {0x10740, 0x10755}, {0x10760, 0x10767}, {0x10780, 0x10785}, {0x10787, 0x107B0},
    {0x107B2, 0x107BA}, {0x10800, 0x10805}, {0x10808, 0x10808}, {0x1080A, 0x10835},
    {0x10837, 0x10838}, {0x1083C, 0x1083C}, {0x1083F, 0x10855}, {0x10860, 0x10876},
    {0x10880, 0x1089E}, {0x108E0, 0x108F2}, {0x108F4, 0x108F5}, {0x10900, 0x10915},
    {0x10920, 0x10939}, {0x10980, 0x109B7}, {0x109BE, 0x109BF}, {0x10A00, 0x10A00},
    {0x10A10, 0x10A13}, {0x10A15, 0x10A17}, {0x10A19, 0x10A35}, {0x10A60, 0x10A7C},
    {0x10A80, 0x10A9C}, {0x10AC0, 0x10AC7}, {0x10AC9, 0x10AE4}, {0x10B00, 0x10B35},
    {0x10B40, 0x10B55}, {0x10B60, 0x10B72}, {0x10B80, 0x10B91}, {0x10C00, 0x10C48},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x10D00, 0x10D23}, {0x10D4A, 0x10D65},
    {0x10D6F, 0x10D85}, {0x10E80, 0x10EA9}, {0x10EB0, 0x10EB1}, {0x10EC2, 0x10EC4},
    {0x10F00, 0x10F1C}, {0x10F27, 0x10F27}, {0x10F30, 0x10F45}, {0x10F70, 0x10F81},
    {0x10FB0, 0x10FC4}, {0x10FE0, 0x10FF6}, {0x11003, 0x11037}, {0x11071, 0x11072},
    {0x11075, 0x11075}, {0x11083, 0x110AF}, {0x110D0, 0x110E8}, {0x11103, 0x11126},
    {0x11144, 0x11144}, {0x11147, 0x11147}, {0x11150, 0x11172}, {0x11176, 0x11176},
    {0x11183, 0x111B2}, {0x111C1, 0x111C4}, {0x111DA, 0x111DA}, {0x111DC, 0x111DC},
    {0x11200, 0x11211}, {0x11213, 0x1122B}, {0x1123F, 0x11240}, {0x11280, 0x11286},
    {0x11288, 0x11288}, {0x1128A, 0x1128D}, {0x1128F, 0x1129D}, {0x1129F, 0x112A8},
    {0x112B0, 0x112DE}, {0x11305, 0x1130C}, {0x1130F, 0x11310}, {0x11313, 0x11328},
    {0x1132A, 0x11330}, {0x11332, 0x11333}, {0x11335, 0x11339}, {0x1133D, 0x1133D},
    {0x11350, 0x11350}, {0x1135D, 0x11361}, {0x11380, 0x11389}, {0x1138B, 0x1138B},
    {0x1138E, 0x1138E}, {0x11390, 0x113B5}, {0x113B7, 0x113B7}, {0x113D1, 0x113D1},
    {0x113D3, 0x113D3}, {0x11400, 0x11434}, {0x11447, 0x1144A}, {0x1145F, 0x11461},
    {0x11480, 0x114AF}, {0x114C4, 0x114C5}, {0x114C7, 0x114C7}, {0x11580, 0x115AE},
    {0x115D8, 0x115DB}, {0x11600, 0x1162F}, {0x11644, 0x11644}, {0x11680, 0x116AA},
    {0x116B8, 0x116B8}, {0x11700, 0x1171A}, {0x11740, 0x11746}, {0x11800, 0x1182B},
    {0x118A0, 0x118DF}, {0x118FF, 0x11906}, {0x11909, 0x11909}, {0x1190C, 0x11913},
    {0x11915, 0x11916}, {0x11918, 0x1192F}, {0x1193F, 0x1193F}, {0x11941, 0x11941},
    {0x119A0, 0x119A7}, {0x119AA, 0x119D0}, {0x119E1, 0x119E1}, {0x119E3, 0x119E3},
    {0x11A00, 0x11A00}, {0x11A0B, 0x11A32}, {0x11A3A, 0x11A3A}, {0x11A50, 0x11A50},
    {0x11A5C, 0x11A89}, {0x11A9D, 0x11A9D}, {0x11AB0, 0x11AF8}, {0x11BC0, 0x11BE0},
    {0x11C00, 0x11C08}, {0x11C0A, 0x11C2E}, {0x11C40, 0x11C40}, {0x11C72, 0x11C8F},
    {0x11D00, 0x11D06}, {0x11D08, 0x11D09}, {0x11D0B, 0x11D30}, {0x11D46, 0x11D46},
    {0x11D60, 0x11D65}, {0x11D67, 0x11D68}, {0x11D6A, 0x11D89}, {0x11D98, 0x11D98},
    {0x11EE0, 0x11EF2}, {0x11F02, 0x11F02}, {0x11F04, 0x11F10}, {0x11F12, 0x11F33},
    {0x11FB0, 0x11FB0}, {0x12000, 0x12399}, {0x12480, 0x12543}, {0x12F90, 0x12FF0},
    {0x13000, 0x1342F}, {0x13441, 0x13446}, {0x13460, 0x143FA}, {0x14400, 0x14646},
    {0x16100, 0x1611D}, {0x16800, 0x16A38}, {0x16A40, 0x16A5E}, {0x16A70, 0x16ABE},
    {0x16AD0, 0x16AED}, {0x16B00, 0x16B2F}, {0x16B40, 0x16B43}, {0x16B63, 0x16B77},
    {0x16B7D, 0x16B8F}, {0x16D40, 0x16D6C}, {0x16E40, 0x16E7F}, {0x16F00, 0x16F4A},
    {0x16F50, 0x16F50}, {0x16F93, 0x16F9F}, {0x16FE0, 0x16FE1}, {0x16FE3, 0x16FE3},
    {0x17000, 0x187F7}, {0x18800, 0x18CD5}, {0x18CFF, 0x18D08}, {0x1AFF0, 0x1AFF3},
    {0x1AFF5, 0x1AFFB}, {0x1AFFD, 0x1AFFE}, {0x1B000, 0x1B122}, {0x1B132, 0x1B132},
    {0x1B150, 0x1B152}, {0x1B155, 0x1B155}, {0x1B164, 0x1B167}, {0x1B170, 0x1B2FB},
    {0x1BC00, 0x1BC6A}, {0x1BC70, 0x1BC7C}, {0x1BC80, 0x1BC88}, {0x1BC90, 0x1BC99},
    {0x1D400, 0x1D454}, {0x1D456, 0x1D49C}, {0x1D49E, 0x1D49F}, {0x1D4A2, 0x1D4A2},
    {0x1D4A5, 0x1D4A6}, {0x1D4A9, 0x1D4AC}, {0x1D4AE, 0x1D4B9}, {0x1D4BB, 0x1D4BB},
    {0x1D4BD, 0x1D4C3}, {0x1D4C5, 0x1D505}, {0x1D507, 0x1D50A}, {0x1D50D, 0x1D514},
    {0x1D516, 0x1D51C}, {0x1D51E, 0x1D539}, {0x1D53B, 0x1D53E}, {0x1D540, 0x1D544},
    {0x1D546, 0x1D546}, {0x1D54A, 0x1D550}, {0x1D552, 0x1D6A5}, {0x1D6A8, 0x1D6C0},
    {0x1D6C2, 0x1D6DA}, {0x1D6DC, 0x1D6FA}, {0x1D6FC, 0x1D714}, {0x1D716, 0x1D734},
    {0x1D736, 0x1D74E}, {0x1D750, 0x1D76E}, {0x1D770, 0x1D788}, {0x1D78A, 0x1D7A8},
    {0x1D7AA, 0x1D7C2}, {0x1D7C4, 0x1D7CB}, {0x1DF00, 0x1DF1E}, {0x1DF25, 0x1DF2A},
    {0x1E030, 0x1E06D}, {0x1E100, 0x1E12C}, {0x1E137, 0x1E13D}, {0x1E14E, 0x1E14E},
    {0x1E290, 0x1E2AD}, {0x1E2C0, 0x1E2EB}, {0x1E4D0, 0x1E4EB}, {0x1E5D0, 0x1E5ED},
    {0x1E5F0, 0x1E5F0}, {0x1E7E0, 0x1E7E6}, {0x1E7E8, 0x1E7EB}, {0x1E7ED, 0x1E7EE},
    {0x1E7F0, 0x1E7FE}, {0x1E800, 0x1E8C4}, {0x1E900, 0x1E943}, {0x1E94B, 0x1E94B},
    {0x1EE00, 0x1EE03}, {0x1EE05, 0x1EE1F}, {0x1EE21, 0x1EE22}, {0x1EE24, 0x1EE24},
    {0x1EE27, 0x1EE27}, {0x1EE29, 0x1EE32}, {0x1EE34, 0x1EE37}, {0x1EE39, 0x1EE39},
    {0x1EE3B, 0x1EE3B}, {0x1EE42, 0x1EE42}, {0x1EE47, 0x1EE47}, {0x1EE49, 0x1EE49},
    {0x1EE4B, 0x1EE4B}, {0x1EE4D, 0x1EE4F}, {0x1EE51, 0x1EE52}, {0x1EE54, 0x1EE54},
    {0x1EE57, 0x1EE57}, {0x1EE59, 0x1EE59}, {0x1EE5B, 0x1EE5B}, {0x1EE5D, 0x1EE5D},
    {0x1EE5F, 0x1EE5F}, {0x1EE61, 0x1EE62}, {0x1EE64, 0x1EE64}, {0x1EE67, 0x1EE6A},
    {0x1EE6C, 0x1EE72}, {0x1EE74, 0x1EE77}, {0x1EE79, 0x1EE7C}, {0x1EE7E, 0x1EE7E},
    {0x1EE80, 0x1EE89}, {0x1EE8B, 0x1EE9B}, {0x1EEA1, 0x1EEA3}, {0x1EEA5, 0x1EEA9},
    {0x1EEAB, 0x1EEBB}, {0x20000, 0x2A6DF}, {0x2A700, 0x2B739}, {0x2B740, 0x2B81D},
    {0x2B820, 0x2CEA1}, {0x2CEB0, 0x2EBE0}, {0x2EBF0, 0x2EE5D}, {0x2F800, 0x2FA1D},
    {0x30000, 0x3134A}, {0x31350, 0x323AF},
};
constexpr CodeRange kNumberRanges[] = {
    {0xB2, 0xB3}, {0xB9, 0xB9}, {0xBC, 0xBE}, {0x660, 0x669}, {0x6F0, 0x6F9}, {0x7C0, 0x7C9},
    {0x966, 0x96F}, {0x9E6, 0x9EF}, {0x9F4, 0x9F9}, {0xA66, 0xA6F}, {0xAE6, 0xAEF}, {0xB66, 0xB6F},
    {0xB72, 0xB77}, {0xBE6, 0xBF2}, {0xC66, 0xC6F}, {0xC78, 0xC7E}, {0xCE6, 0xCEF}, {0xD58, 0xD5E},
    {0xD66, 0xD78}, {0xDE6, 0xDEF}, {0xE50, 0xE59}, {0xED0, 0xED9}, {0xF20, 0xF33},
    {0x1040, 0x1049}, {0x1090, 0x1099}, {0x1369, 0x137C}, {0x16EE, 0x16F0}, {0x17E0, 0x17E9},
    {0x17F0, 0x17F9}, {0x1810, 0x1819}, {0x1946, 0x194F}, {0x19D0, 0x19DA}, {0x1A80, 0x1A89},
    {0x1A90, 0x1A99}, {0x1B50, 0x1B59}, {0x1BB0, 0x1BB9}, {0x1C40, 0x1C49}, {0x1C50, 0x1C59},
    {0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2150, 0x2182}, {0x2185, 0x2189},
    {0x2460, 0x249B}, {0x24EA, 0x24FF}, {0x2776, 0x2793}, {0x2CFD, 0x2CFD}, {0x3007, 0x3007},
    {0x3021, 0x3029}, {0x3038, 0x303A}, {0x3192, 0x3195}, {0x3220, 0x3229}, {0x3248, 0x324F},
    {0x3251, 0x325F}, {0x3280, 0x3289}, {0x32B1, 0x32BF}, {0xA620, 0xA629}, {0xA6E6, 0xA6EF},
    {0xA830, 0xA835}, {0xA8D0, 0xA8D9}, {0xA900, 0xA909}, {0xA9D0, 0xA9D9}, {0xA9F0, 0xA9F9},
    {0xAA50, 0xAA59}, {0xABF0, 0xABF9}, {0xFF10, 0xFF19}, {0x10107, 0x10133}, {0x10140, 0x10178},
    {0x1018A, 0x1018B}, {0x102E1, 0x102FB}, {0x10320, 0x10323}, {0x10341, 0x10341},
    {0x1034A, 0x1034A}, {0x103D1, 0x103D5}, {0x104A0, 0x104A9}, {0x10858, 0x1085F},
    {0x10879, 0x1087F}, {0x108A7, 0x108AF}, {0x108FB, 0x108FF}, {0x10916, 0x1091B},
    {0x109BC, 0x109BD}, {0x109C0, 0x109CF}, {0x109D2, 0x109FF}, {0x10A40, 0x10A48},
    {0x10A7D, 0x10A7E}, {0x10A9D, 0x10A9F}, {0x10AEB, 0x10AEF}, {0x10B58, 0x10B5F},
    {0x10B78, 0x10B7F}, {0x10BA9, 0x10BAF}, {0x10CFA, 0x10CFF}, {0x10D30, 0x10D39},
    {0x10D40, 0x10D49}, {0x10E60, 0x10E7E}, {0x10F1D, 0x10F26}, {0x10F51, 0x10F54},
    {0x10FC5, 0x10FCB}, {0x11052, 0x1106F}, {0x110F0, 0x110F9}, {0x11136, 0x1113F},
    {0x111D0, 0x111D9}, {0x111E1, 0x111F4}, {0x112F0, 0x112F9}, {0x11450, 0x11459},
    {0x114D0, 0x114D9}, {0x11650, 0x11659}, {0x116C0, 0x116C9}, {0x116D0, 0x116E3},
    {0x11730, 0x1173B}, {0x118E0, 0x118F2}, {0x11950, 0x11959}, {0x11BF0, 0x11BF9},
    {0x11C50, 0x11C6C}, {0x11D50, 0x11D59}, {0x11DA0, 0x11DA9}, {0x11F50, 0x11F59},
    {0x11FC0, 0x11FD4}, {0x12400, 0x1246E}, {0x16130, 0x16139}, {0x16A60, 0x16A69},
    {0x16AC0, 0x16AC9}, {0x16B50, 0x16B59}, {0x16B5B, 0x16B61}, {0x16D70, 0x16D79},
    {0x16E80, 0x16E96}, {0x1CCF0, 0x1CCF9}, {0x1D2C0, 0x1D2D3}, {0x1D2E0, 0x1D2F3},
    {0x1D360, 0x1D378}, {0x1D7CE, 0x1D7FF}, {0x1E140, 0x1E149}, {0x1E2F0, 0x1E2F9},
    {0x1E4F0, 0x1E4F9}, {0x1E5F1, 0x1E5FA}, {0x1E8C7, 0x1E8CF}, {0x1E950, 0x1E959},
    {0x1EC71, 0x1ECAB}, {0x1ECAD, 0x1ECAF}, {0x1ECB1, 0x1ECB4}, {0x1ED01, 0x1ED2D},
    {0x1ED2F, 0x1ED3D}, {0x1F100, 0x1F10C}, {0x1FBF0, 0x1FBF9},
};

// The non-ASCII code points HF's added-token matcher takes as word characters beside a single_word
// token (Rust's \w: alphabetics, marks, decimal digits, connector punctuation, joiners), probed the
// same way.
constexpr CodeRange kWordRanges[] = {
    {0xAA, 0xAA}, {0xB5, 0xB5}, {0xBA, 0xBA}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x2C1},
    {0x2C6, 0x2D1}, {0x2E0, 0x2E4}, {0x2EC, 0x2EC}, {0x2EE, 0x2EE}, {0x300, 0x374}, {0x376, 0x377},
    {0x37A, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C}, {0x38E, 0x3A1},
    {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x483, 0x52F}, {0x531, 0x556}, {0x559, 0x559}, {0x560, 0x588},
    {0x591, 0x5BD}, {0x5BF, 0x5BF}, {0x5C1, 0x5C2}, {0x5C4, 0x5C5}, {0x5C7, 0x5C7}, {0x5D0, 0x5EA},
    {0x5EF, 0x5F2}, {0x610, 0x61A}, {0x620, 0x669}, {0x66E, 0x6D3}, {0x6D5, 0x6DC}, {0x6DF, 0x6E8},
    {0x6EA, 0x6FC}, {0x6FF, 0x6FF}, {0x710, 0x74A}, {0x74D, 0x7B1}, {0x7C0, 0x7F5}, {0x7FA, 0x7FA},
    {0x7FD, 0x7FD}, {0x800, 0x82D}, {0x840, 0x85B}, {0x860, 0x86A}, {0x870, 0x887}, {0x889, 0x88E},
    {0x897, 0x8E1}, {0x8E3, 0x963}, {0x966, 0x96F}, {0x971, 0x983}, {0x985, 0x98C}, {0x98F, 0x990},
    {0x993, 0x9A8}, {0x9AA, 0x9B0}, {0x9B2, 0x9B2}, {0x9B6, 0x9B9}, {0x9BC, 0x9C4}, {0x9C7, 0x9C8},
    {0x9CB, 0x9CE}, {0x9D7, 0x9D7}, {0x9DC, 0x9DD}, {0x9DF, 0x9E3}, {0x9E6, 0x9F1}, {0x9FC, 0x9FC},
    {0x9FE, 0x9FE}, {0xA01, 0xA03}, {0xA05, 0xA0A}, {0xA0F, 0xA10}, {0xA13, 0xA28}, {0xA2A, 0xA30},
    {0xA32, 0xA33}, {0xA35, 0xA36}, {0xA38, 0xA39}, {0xA3C, 0xA3C}, {0xA3E, 0xA42}, {0xA47, 0xA48},
    {0xA4B, 0xA4D}, {0xA51, 0xA51}, {0xA59, 0xA5C}, {0xA5E, 0xA5E}, {0xA66, 0xA75}, {0xA81, 0xA83},
    {0xA85, 0xA8D}, {0xA8F, 0xA91}, {0xA93, 0xAA8}, {0xAAA, 0xAB0}, {0xAB2, 0xAB3}, {0xAB5, 0xAB9},
    {0xABC, 0xAC5}, {0xAC7, 0xAC9}, {0xACB, 0xACD}, {0xAD0, 0xAD0}, {0xAE0, 0xAE3}, {0xAE6, 0xAEF},
    {0xAF9, 0xAFF}, {0xB01, 0xB03}, {0xB05, 0xB0C}, {0xB0F, 0xB10}, {0xB13, 0xB28}, {0xB2A, 0xB30},
    {0xB32, 0xB33}, {0xB35, 0xB39}, {0xB3C, 0xB44}, {0xB47, 0xB48}, {0xB4B, 0xB4D}, {0xB55, 0xB57},
    {0xB5C, 0xB5D}, {0xB5F, 0xB63}, {0xB66, 0xB6F}, {0xB71, 0xB71}, {0xB82, 0xB83}, {0xB85, 0xB8A},
    {0xB8E, 0xB90}, {0xB92, 0xB95}, {0xB99, 0xB9A}, {0xB9C, 0xB9C}, {0xB9E, 0xB9F}, {0xBA3, 0xBA4},
    {0xBA8, 0xBAA}, {0xBAE, 0xBB9}, {0xBBE, 0xBC2}, {0xBC6, 0xBC8}, {0xBCA, 0xBCD}, {0xBD0, 0xBD0},
    {0xBD7, 0xBD7}, {0xBE6, 0xBEF}, {0xC00, 0xC0C}, {0xC0E, 0xC10}, {0xC12, 0xC28}, {0xC2A, 0xC39},
    {0xC3C, 0xC44}, {0xC46, 0xC48}, {0xC4A, 0xC4D}, {0xC55, 0xC56}, {0xC58, 0xC5A}, {0xC5D, 0xC5D},
    {0xC60, 0xC63}, {0xC66, 0xC6F}, {0xC80, 0xC83}, {0xC85, 0xC8C}, {0xC8E, 0xC90}, {0xC92, 0xCA8},
    {0xCAA, 0xCB3}, {0xCB5, 0xCB9}, {0xCBC, 0xCC4}, {0xCC6, 0xCC8}, {0xCCA, 0xCCD}, {0xCD5, 0xCD6},
    {0xCDD, 0xCDE}, {0xCE0, 0xCE3}, {0xCE6, 0xCEF}, {0xCF1, 0xCF3}, {0xD00, 0xD0C}, {0xD0E, 0xD10},
    {0xD12, 0xD44}, {0xD46, 0xD48}, {0xD4A, 0xD4E}, {0xD54, 0xD57}, {0xD5F, 0xD63}, {0xD66, 0xD6F},
    {0xD7A, 0xD7F}, {0xD81, 0xD83}, {0xD85, 0xD96}, {0xD9A, 0xDB1}, {0xDB3, 0xDBB}, {0xDBD, 0xDBD},
    {0xDC0, 0xDC6}, {0xDCA, 0xDCA}, {0xDCF, 0xDD4}, {0xDD6, 0xDD6}, {0xDD8, 0xDDF}, {0xDE6, 0xDEF},
    {0xDF2, 0xDF3}, {0xE01, 0xE3A}, {0xE40, 0xE4E}, {0xE50, 0xE59}, {0xE81, 0xE82}, {0xE84, 0xE84},
    {0xE86, 0xE8A}, {0xE8C, 0xEA3}, {0xEA5, 0xEA5}, {0xEA7, 0xEBD}, {0xEC0, 0xEC4}, {0xEC6, 0xEC6},
    {0xEC8, 0xECE}, {0xED0, 0xED9}, {0xEDC, 0xEDF}, {0xF00, 0xF00}, {0xF18, 0xF19}, {0xF20, 0xF29},
    {0xF35, 0xF35}, {0xF37, 0xF37}, {0xF39, 0xF39}, {0xF3E, 0xF47}, {0xF49, 0xF6C}, {0xF71, 0xF84},
    {0xF86, 0xF97}, {0xF99, 0xFBC}, {0xFC6, 0xFC6}, {0x1000, 0x1049}, {0x1050, 0x109D},
    {0x10A0, 0x10C5}, {0x10C7, 0x10C7}, {0x10CD, 0x10CD}, {0x10D0, 0x10FA}, {0x10FC, 0x1248},
    {0x124A, 0x124D}, {0x1250, 0x1256}, {0x1258, 0x1258}, {0x125A, 0x125D}, {0x1260, 0x1288},
    {0x128A, 0x128D}, {0x1290, 0x12B0}, {0x12B2, 0x12B5}, {0x12B8, 0x12BE}, {0x12C0, 0x12C0},
    {0x12C2, 0x12C5}, {0x12C8, 0x12D6}, {0x12D8, 0x1310}, {0x1312, 0x1315}, {0x1318, 0x135A},
    {0x135D, 0x135F}, {0x1380, 0x138F}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1401, 0x166C},
    {0x166F, 0x167F}, {0x1681, 0x169A}, {0x16A0, 0x16EA}, {0x16EE, 0x16F8}, {0x1700, 0x1715},
    {0x171F, 0x1734}, {0x1740, 0x1753}, {0x1760, 0x176C}, {0x176E, 0x1770}, {0x1772, 0x1773},
    {0x1780, 0x17D3}, {0x17D7, 0x17D7}, {0x17DC, 0x17DD}, {0x17E0, 0x17E9}, {0x180B, 0x180D},
    {0x180F, 0x1819}, {0x1820, 0x1878}, {0x1880, 0x18AA}, {0x18B0, 0x18F5}, {0x1900, 0x191E},
    {0x1920, 0x192B}, {0x1930, 0x193B}, {0x1946, 0x196D}, {0x1970, 0x1974}, {0x1980, 0x19AB},
    {0x19B0, 0x19C9}, {0x19D0, 0x19D9}, {0x1A00, 0x1A1B}, {0x1A20, 0x1A5E}, {0x1A60, 0x1A7C},
    {0x1A7F, 0x1A89}, {0x1A90, 0x1A99}, {0x1AA7, 0x1AA7}, {0x1AB0, 0x1ACE}, {0x1B00, 0x1B4C},
    {0x1B50, 0x1B59}, {0x1B6B, 0x1B73}, {0x1B80, 0x1BF3}, {0x1C00, 0x1C37}, {0x1C40, 0x1C49},
    {0x1C4D, 0x1C7D}, {0x1C80, 0x1C8A}, {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF}, {0x1CD0, 0x1CD2},
    {0x1CD4, 0x1CFA}, {0x1D00, 0x1F15}, {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D},
    {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D},
    {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC},
    {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC},
    {0x200C, 0x200D}, {0x203F, 0x2040}, {0x2054, 0x2054}, {0x2071, 0x2071}, {0x207F, 0x207F},
    {0x2090, 0x209C}, {0x20D0, 0x20F0}, {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113},
    {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
    {0x212A, 0x212D}, {0x212F, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149}, {0x214E, 0x214E},
    {0x2160, 0x2188}, {0x24B6, 0x24E9}, {0x2C00, 0x2CE4}, {0x2CEB, 0x2CF3}, {0x2D00, 0x2D25},
    {0x2D27, 0x2D27}, {0x2D2D, 0x2D2D}, {0x2D30, 0x2D67}, {0x2D6F, 0x2D6F}, {0x2D7F, 0x2D96},
    {0x2DA0, 0x2DA6}, {0x2DA8, 0x2DAE}, {0x2DB0, 0x2DB6}, {0x2DB8, 0x2DBE}, {0x2DC0, 0x2DC6},
    {0x2DC8, 0x2DCE}, {0x2DD0, 0x2DD6}, {0x2DD8, 0x2DDE}, {0x2DE0, 0x2DFF}, {0x2E2F, 0x2E2F},
    {0x3005, 0x3007}, {0x3021, 0x302F}, {0x3031, 0x3035}, {0x3038, 0x303C}, {0x3041, 0x3096},
    {0x3099, 0x309A}, {0x309D, 0x309F}, {0x30A1, 0x30FA}, {0x30FC, 0x30FF}, {0x3105, 0x312F},
    {0x3131, 0x318E}, {0x31A0, 0x31BF}, {0x31F0, 0x31FF}, {0x3400, 0x4DBF}, {0x4E00, 0xA48C},
    {0xA4D0, 0xA4FD}, {0xA500, 0xA60C}, {0xA610, 0xA62B}, {0xA640, 0xA672}, {0xA674, 0xA67D},
    {0xA67F, 0xA6F1}, {0xA717, 0xA71F}, {0xA722, 0xA788}, {0xA78B, 0xA7CD}, {0xA7D0, 0xA7D1},
    {0xA7D3, 0xA7D3}, {0xA7D5, 0xA7DC}, {0xA7F2, 0xA827}, {0xA82C, 0xA82C}, {0xA840, 0xA873},
    {0xA880, 0xA8C5}, {0xA8D0, 0xA8D9}, {0xA8E0, 0xA8F7}, {0xA8FB, 0xA8FB}, {0xA8FD, 0xA92D},
    {0xA930, 0xA953}, {0xA960, 0xA97C}, {0xA980, 0xA9C0}, {0xA9CF, 0xA9D9}, {0xA9E0, 0xA9FE},
    {0xAA00, 0xAA36}, {0xAA40, 0xAA4D}, {0xAA50, 0xAA59}, {0xAA60, 0xAA76}, {0xAA7A, 0xAAC2},
    {0xAADB, 0xAADD}, {0xAAE0, 0xAAEF}, {0xAAF2, 0xAAF6}, {0xAB01, 0xAB06}, {0xAB09, 0xAB0E},
    {0xAB11, 0xAB16}, {0xAB20, 0xAB26}, {0xAB28, 0xAB2E}, {0xAB30, 0xAB5A}, {0xAB5C, 0xAB69},
    {0xAB70, 0xABEA}, {0xABEC, 0xABED}, {0xABF0, 0xABF9}, {0xAC00, 0xD7A3}, {0xD7B0, 0xD7C6},
    {0xD7CB, 0xD7FB}, {0xF900, 0xFA6D}, {0xFA70, 0xFAD9}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17},
    {0xFB1D, 0xFB28}, {0xFB2A, 0xFB36}, {0xFB38, 0xFB3C}, {0xFB3E, 0xFB3E}, {0xFB40, 0xFB41},
    {0xFB43, 0xFB44}, {0xFB46, 0xFBB1}, {0xFBD3, 0xFD3D}, {0xFD50, 0xFD8F}, {0xFD92, 0xFDC7},
    {0xFDF0, 0xFDFB}, {0xFE00, 0xFE0F}, {0xFE20, 0xFE2F}, {0xFE33, 0xFE34}, {0xFE4D, 0xFE4F},
    {0xFE70, 0xFE74}, {0xFE76, 0xFEFC}, {0xFF10, 0xFF19}, {0xFF21, 0xFF3A}, {0xFF3F, 0xFF3F},
    {0xFF41, 0xFF5A}, {0xFF66, 0xFFBE}, {0xFFC2, 0xFFC7}, {0xFFCA, 0xFFCF}, {0xFFD2, 0xFFD7},
    {0xFFDA, 0xFFDC}, {0x10000, 0x1000B}, {0x1000D, 0x10026}, {0x10028, 0x1003A},
    {0x1003C, 0x1003D}, {0x1003F, 0x1004D}, {0x10050, 0x1005D}, {0x10080, 0x100FA},
    {0x10140, 0x10174}, {0x101FD, 0x101FD}, {0x10280, 0x1029C}, {0x102A0, 0x102D0},
    {0x102E0, 0x102E0}, {0x10300, 0x1031F}, {0x1032D, 0x1034A}, {0x10350, 0x1037A},
    {0x10380, 0x1039D}, {0x103A0, 0x103C3}, {0x103C8, 0x103CF}, {0x103D1, 0x103D5},
    {0x10400, 0x1049D}, {0x104A0, 0x104A9}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10500, 0x10527}, {0x10530, 0x10563}, {0x10570, 0x1057A}, {0x1057C, 0x1058A},
    {0x1058C, 0x10592}, {0x10594, 0x10595}, {0x10597, 0x105A1}, {0x105A3, 0x105B1},
    {0x105B3, 0x105B9}, {0x105BB, 0x105BC}, {0x105C0, 0x105F3}, {0x10600, 0x10736},
    {0x10740, 0x10755}, {0x10760, 0x10767}, {0x10780, 0x10785}, {0x10787, 0x107B0},
    {0x107B2, 0x107BA}, {0x10800, 0x10805}, {0x10808, 0x10808}, {0x1080A, 0x10835},
    {0x10837, 0x10838}, {0x1083C, 0x1083C}, {0x1083F, 0x10855}, {0x10860, 0x10876},
    {0x10880, 0x1089E}, {0x108E0, 0x108F2}, {0x108F4, 0x108F5}, {0x10900, 0x10915},
    {0x10920, 0x10939}, {0x10980, 0x109B7}, {0x109BE, 0x109BF}, {0x10A00, 0x10A03},
    {0x10A05, 0x10A06}, {0x10A0C, 0x10A13}, {0x10A15, 0x10A17}, {0x10A19, 0x10A35},
    {0x10A38, 0x10A3A}, {0x10A3F, 0x10A3F}, {0x10A60, 0x10A7C}, {0x10A80, 0x10A9C},
    {0x10AC0, 0x10AC7}, {0x10AC9, 0x10AE6}, {0x10B00, 0x10B35}, {0x10B40, 0x10B55},
    {0x10B60, 0x10B72}, {0x10B80, 0x10B91}, {0x10C00, 0x10C48}, {0x10C80, 0x10CB2},
    {0x10CC0, 0x10CF2}, {0x10D00, 0x10D27}, {0x10D30, 0x10D39}, {0x10D40, 0x10D65},
    {0x10D69, 0x10D6D}, {0x10D6F, 0x10D85}, {0x10E80, 0x10EA9}, {0x10EAB, 0x10EAC},
    {0x10EB0, 0x10EB1}, {0x10EC2, 0x10EC4}, {0x10EFC, 0x10F1C}, {0x10F27, 0x10F27},
    {0x10F30, 0x10F50}, {0x10F70, 0x10F85}, {0x10FB0, 0x10FC4}, {0x10FE0, 0x10FF6},
    {0x11000, 0x11046}, {0x11066, 0x11075}, {0x1107F, 0x110BA}, {0x110C2, 0x110C2},
    {0x110D0, 0x110E8}, {0x110F0, 0x110F9}, {0x11100, 0x11134}, {0x11136, 0x1113F},
    {0x11144, 0x11147}, {0x11150, 0x11173}, {0x11176, 0x11176}, {0x11180, 0x111C4},
    {0x111C9, 0x111CC}, {0x111CE, 0x111DA}, {0x111DC, 0x111DC}, {0x11200, 0x11211},
    {0x11213, 0x11237}, {0x1123E, 0x11241}, {0x11280, 0x11286}, {0x11288, 0x11288},
    {0x1128A, 0x1128D}, {0x1128F, 0x1129D}, {0x1129F, 0x112A8}, {0x112B0, 0x112EA},
    {0x112F0, 0x112F9}, {0x11300, 0x11303}, {0x11305, 0x1130C}, {0x1130F, 0x11310},
    {0x11313, 0x11328}, {0x1132A, 0x11330}, {0x11332, 0x11333}, {0x11335, 0x11339},
    {0x1133B, 0x11344}, {0x11347, 0x11348}, {0x1134B, 0x1134D}, {0x11350, 0x11350},
    {0x11357, 0x11357}, {0x1135D, 0x11363}, {0x11366, 0x1136C}, {0x11370, 0x11374},
    {0x11380, 0x11389}, {0x1138B, 0x1138B}, {0x1138E, 0x1138E}, {0x11390, 0x113B5},
    {0x113B7, 0x113C0}, {0x113C2, 0x113C2}, {0x113C5, 0x113C5}, {0x113C7, 0x113CA},
    {0x113CC, 0x113D3}, {0x113E1, 0x113E2}, {0x11400, 0x1144A}, {0x11450, 0x11459},
    {0x1145E, 0x11461}, {0x11480, 0x114C5}, {0x114C7, 0x114C7}, {0x114D0, 0x114D9},
    {0x11580, 0x115B5}, {0x115B8, 0x115C0}, {0x115D8, 0x115DD}, {0x11600, 0x11640},
    {0x11644, 0x11644}, {0x11650, 0x11659}, {0x11680, 0x116B8}, {0x116C0, 0x116C9},
    {0x116D0, 0x116E3}, {0x11700, 0x1171A}, {0x1171D, 0x1172B}, {0x11730, 0x11739},
    {0x11740, 0x11746}, {0x11800, 0x1183A}, {0x118A0, 0x118E9}, {0x118FF, 0x11906},
    {0x11909, 0x11909}, {0x1190C, 0x11913}, {0x11915, 0x11916}, {0x11918, 0x11935},
    {0x11937, 0x11938}, {0x1193B, 0x11943}, {0x11950, 0x11959}, {0x119A0, 0x119A7},
    {0x119AA, 0x119D7}, {0x119DA, 0x119E1}, {0x119E3, 0x119E4}, {0x11A00, 0x11A3E},
    {0x11A47, 0x11A47}, {0x11A50, 0x11A99}, {0x11A9D, 0x11A9D}, {0x11AB0, 0x11AF8},
    {0x11BC0, 0x11BE0}, {0x11BF0, 0x11BF9}, {0x11C00, 0x11C08}, {0x11C0A, 0x11C36},
    {0x11C38, 0x11C40}, {0x11C50, 0x11C59}, {0x11C72, 0x11C8F}, {0x11C92, 0x11CA7},
    {0x11CA9, 0x11CB6}, {0x11D00, 0x11D06}, {0x11D08, 0x11D09}, {0x11D0B, 0x11D36},
    {0x11D3A, 0x11D3A}, {0x11D3C, 0x11D3D}, {0x11D3F, 0x11D47}, {0x11D50, 0x11D59},
    {0x11D60, 0x11D65}, {0x11D67, 0x11D68}, {0x11D6A, 0x11D8E}, {0x11D90, 0x11D91},
    {0x11D93, 0x11D98}, {0x11DA0, 0x11DA9}, {0x11EE0, 0x11EF6}, {0x11F00, 0x11F10},
    {0x11F12, 0x11F3A}, {0x11F3E, 0x11F42}, {0x11F50, 0x11F5A}, {0x11FB0, 0x11FB0},
    {0x12000, 0x12399}, {0x12400, 0x1246E}, {0x12480, 0x12543}, {0x12F90, 0x12FF0},
    {0x13000, 0x1342F}, {0x13440, 0x13455}, {0x13460, 0x143FA}, {0x14400, 0x14646},
    {0x16100, 0x16139}, {0x16800, 0x16A38}, {0x16A40, 0x16A5E}, {0x16A60, 0x16A69},
    {0x16A70, 0x16ABE}, {0x16AC0, 0x16AC9}, {0x16AD0, 0x16AED}, {0x16AF0, 0x16AF4},
    {0x16B00, 0x16B36}, {0x16B40, 0x16B43}, {0x16B50, 0x16B59}, {0x16B63, 0x16B77},
    {0x16B7D, 0x16B8F}, {0x16D40, 0x16D6C}, {0x16D70, 0x16D79}, {0x16E40, 0x16E7F},
    {0x16F00, 0x16F4A}, {0x16F4F, 0x16F87}, {0x16F8F, 0x16F9F}, {0x16FE0, 0x16FE1},
    {0x16FE3, 0x16FE4}, {0x16FF0, 0x16FF1}, {0x17000, 0x187F7}, {0x18800, 0x18CD5},
    {0x18CFF, 0x18D08}, {0x1AFF0, 0x1AFF3}, {0x1AFF5, 0x1AFFB}, {0x1AFFD, 0x1AFFE},
    {0x1B000, 0x1B122}, {0x1B132, 0x1B132}, {0x1B150, 0x1B152}, {0x1B155, 0x1B155},
    {0x1B164, 0x1B167}, {0x1B170, 0x1B2FB}, {0x1BC00, 0x1BC6A}, {0x1BC70, 0x1BC7C},
    {0x1BC80, 0x1BC88}, {0x1BC90, 0x1BC99}, {0x1BC9D, 0x1BC9E}, {0x1CCF0, 0x1CCF9},
    {0x1CF00, 0x1CF2D}, {0x1CF30, 0x1CF46}, {0x1D165, 0x1D169}, {0x1D16D, 0x1D172},
    {0x1D17B, 0x1D182}, {0x1D185, 0x1D18B}, {0x1D1AA, 0x1D1AD}, {0x1D242, 0x1D244},
    {0x1D400, 0x1D454}, {0x1D456, 0x1D49C}, {0x1D49E, 0x1D49F}, {0x1D4A2, 0x1D4A2},
    {0x1D4A5, 0x1D4A6}, {0x1D4A9, 0x1D4AC}, {0x1D4AE, 0x1D4B9}, {0x1D4BB, 0x1D4BB},
    {0x1D4BD, 0x1D4C3}, {0x1D4C5, 0x1D505}, {0x1D507, 0x1D50A}, {0x1D50D, 0x1D514},
    {0x1D516, 0x1D51C}, {0x1D51E, 0x1D539}, {0x1D53B, 0x1D53E}, {0x1D540, 0x1D544},
    {0x1D546, 0x1D546}, {0x1D54A, 0x1D550}, {0x1D552, 0x1D6A5}, {0x1D6A8, 0x1D6C0},
    {0x1D6C2, 0x1D6DA}, {0x1D6DC, 0x1D6FA}, {0x1D6FC, 0x1D714}, {0x1D716, 0x1D734},
    {0x1D736, 0x1D74E}, {0x1D750, 0x1D76E}, {0x1D770, 0x1D788}, {0x1D78A, 0x1D7A8},
    {0x1D7AA, 0x1D7C2}, {0x1D7C4, 0x1D7CB}, {0x1D7CE, 0x1D7FF}, {0x1DA00, 0x1DA36},
    {0x1DA3B, 0x1DA6C}, {0x1DA75, 0x1DA75}, {0x1DA84, 0x1DA84}, {0x1DA9B, 0x1DA9F},
    {0x1DAA1, 0x1DAAF}, {0x1DF00, 0x1DF1E}, {0x1DF25, 0x1DF2A}, {0x1E000, 0x1E006},
    {0x1E008, 0x1E018}, {0x1E01B, 0x1E021}, {0x1E023, 0x1E024}, {0x1E026, 0x1E02A},
    {0x1E030, 0x1E06D}, {0x1E08F, 0x1E08F}, {0x1E100, 0x1E12C}, {0x1E130, 0x1E13D},
    {0x1E140, 0x1E149}, {0x1E14E, 0x1E14E}, {0x1E290, 0x1E2AE}, {0x1E2C0, 0x1E2F9},
    {0x1E4D0, 0x1E4F9}, {0x1E5D0, 0x1E5FA}, {0x1E7E0, 0x1E7E6}, {0x1E7E8, 0x1E7EB},
    {0x1E7ED, 0x1E7EE}, {0x1E7F0, 0x1E7FE}, {0x1E800, 0x1E8C4}, {0x1E8D0, 0x1E8D6},
    {0x1E900, 0x1E94B}, {0x1E950, 0x1E959}, {0x1EE00, 0x1EE03}, {0x1EE05, 0x1EE1F},
    {0x1EE21, 0x1EE22}, {0x1EE24, 0x1EE24}, {0x1EE27, 0x1EE27}, {0x1EE29, 0x1EE32},
    {0x1EE34, 0x1EE37}, {0x1EE39, 0x1EE39}, {0x1EE3B, 0x1EE3B}, {0x1EE42, 0x1EE42},
    {0x1EE47, 0x1EE47}, {0x1EE49, 0x1EE49}, {0x1EE4B, 0x1EE4B}, {0x1EE4D, 0x1EE4F},
    {0x1EE51, 0x1EE52}, {0x1EE54, 0x1EE54}, {0x1EE57, 0x1EE57}, {0x1EE59, 0x1EE59},
    {0x1EE5B, 0x1EE5B}, {0x1EE5D, 0x1EE5D}, {0x1EE5F, 0x1EE5F}, {0x1EE61, 0x1EE62},
    {0x1EE64, 0x1EE64}, {0x1EE67, 0x1EE6A}, {0x1EE6C, 0x1EE72}, {0x1EE74, 0x1EE77},
    {0x1EE79, 0x1EE7C}, {0x1EE7E, 0x1EE7E}, {0x1EE80, 0x1EE89}, {0x1EE8B, 0x1EE9B},
    {0x1EEA1, 0x1EEA3}, {0x1EEA5, 0x1EEA9}, {0x1EEAB, 0x1EEBB}, {0x1F130, 0x1F149},
    {0x1F150, 0x1F169}, {0x1F170, 0x1F189}, {0x1FBF0, 0x1FBF9}, {0x20000, 0x2A6DF},
    {0x2A700, 0x2B739}, {0x2B740, 0x2B81D}, {0x2B820, 0x2CEA1}, {0x2CEB0, 0x2EBE0},
    {0x2EBF0, 0x2EE5D}, {0x2F800, 0x2FA1D}, {0x30000, 0x3134A}, {0x31350, 0x323AF},
    {0xE0100, 0xE01EF},
};
// clang-format on

bool in_ranges(const CodeRange* begin, const CodeRange* end, uint32_t cp) {
  const CodeRange* it =
      std::upper_bound(begin, end, cp, [](uint32_t c, const CodeRange& r) { return c < r.first; });
  return it != begin && cp <= (it - 1)->last;
}

// Onig's \s (Unicode White_Space), which is also Rust's char::is_whitespace.
bool is_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}
bool is_letter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in_ranges(std::begin(kLetterRanges), std::end(kLetterRanges), cp);
}
bool is_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(std::begin(kNumberRanges), std::end(kNumberRanges), cp);
}
// Rust's char::is_numeric, which HF's Digits pre-tokenizer uses: Rust's newer Unicode (17) adds
// these digits to the regex's \p{N}.
bool is_numeric_char(uint32_t cp) {
  return is_number(cp) || (cp >= 0x11DE0 && cp <= 0x11DE9) || (cp >= 0x16FF4 && cp <= 0x16FF6);
}

enum class CharClass { kLetter, kNumber, kSpace, kOther };

CharClass classify(uint32_t cp) {
  if (is_letter(cp)) return CharClass::kLetter;
  if (is_number(cp)) return CharClass::kNumber;
  if (is_space(cp)) return CharClass::kSpace;
  return CharClass::kOther;
}

// Code points as utf8.h walks them: a byte that does not start valid UTF-8 is one of its own, kInvalid,
// of class "other", so that any byte string can be encoded (and decoded back byte for byte).
using utf8::CodePoint;
using utf8::code_points;
using utf8::kInvalid;
constexpr auto decode_utf8 = utf8::decode;
constexpr auto utf8_length = utf8::sequence_length;
constexpr auto append_utf8 = utf8::append;

// The GPT-2 pre-tokenizer regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// by hand: the alternatives are tried in order at each position, as a backtracking regex
// does, and together they match every code point, so the pieces tile `s`.
// A string's code points and their classes, for the hand-written split regexes below.
struct ClassifiedText {
  std::string_view s;
  std::vector<CodePoint> cps;
  std::vector<CharClass> cls;

  explicit ClassifiedText(std::string_view text) : s(text), cps(code_points(text)), cls(cps.size()) {
    for (size_t i = 0; i < cps.size(); ++i)
      cls[i] = cps[i].cp == kInvalid ? CharClass::kOther : classify(cps[i].cp);
  }
  size_t run_end(size_t i, CharClass c) const {
    while (i < cls.size() && cls[i] == c) ++i;
    return i;
  }
  // The bytes of code points [i, end).
  std::string_view piece(size_t i, size_t end) const {
    const size_t to = end < cps.size() ? cps[end].pos : s.size();
    return s.substr(cps[i].pos, to - cps[i].pos);
  }
};

std::vector<std::string_view> gpt2_split(std::string_view s) {
  const ClassifiedText t(s);
  const std::vector<CodePoint>& cps = t.cps;
  const std::vector<CharClass>& cls = t.cls;
  const size_t n = cps.size();
  const auto run_end = [&](size_t i, CharClass c) { return t.run_end(i, c); };
  const auto cp_at = [&](size_t i) { return i < n ? cps[i].cp : 0u; };

  std::vector<std::string_view> pieces;
  for (size_t i = 0; i < n;) {
    size_t end = i;  // one past the last code point of the match
    if (cps[i].cp == '\'' && i + 1 < n) {
      const uint32_t a = cp_at(i + 1), b = cp_at(i + 2);
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        end = i + 2;
      } else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        end = i + 3;
      }
    }
    if (end == i) {
      // ` ?X+` for X in letters, numbers, other: an optional space, then a run of one class.
      const size_t start =
          (cps[i].cp == ' ' && i + 1 < n && cls[i + 1] != CharClass::kSpace) ? i + 1 : i;
      if (cls[start] != CharClass::kSpace) {
        end = run_end(start, cls[start]);
      } else {
        // \s+(?!\S): the whitespace run, less its last character when a non-space follows
        // (so that the last space can start the next word); else \s+ for a single one.
        const size_t ws_end = run_end(i, CharClass::kSpace);
        end = (ws_end == n || ws_end - i == 1) ? ws_end : ws_end - 1;
      }
    }
    pieces.push_back(t.piece(i, end));
    i = end;
  }
  return pieces;
}

// The Llama-3 pre-tokenizer regex (tiktoken's cl100k pattern)
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*
//   |\s*[\r\n]+|\s+(?!\S)|\s+
// by hand, alternatives in order at each position as in gpt2_split.
std::vector<std::string_view> llama3_split(std::string_view s) {
  const ClassifiedText t(s);
  const std::vector<CodePoint>& cps = t.cps;
  const std::vector<CharClass>& cls = t.cls;
  const size_t n = cps.size();
  const auto run_end = [&](size_t i, CharClass c) { return t.run_end(i, c); };
  const auto lower = [&](size_t i) { return i < n && cps[i].cp < 0x80 ? cps[i].cp | 0x20u : 0u; };
  const auto newline = [&](size_t i) { return cps[i].cp == '\r' || cps[i].cp == '\n'; };

  std::vector<std::string_view> pieces;
  for (size_t i = 0; i < n;) {
    size_t end = i;  // one past the last code point of the match
    if (cps[i].cp == '\'') {  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
      const uint32_t a = lower(i + 1), b = lower(i + 2);
      if (a == 's' || a == 't' || a == 'm' || a == 'd') end = i + 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) end = i + 3;
    }
    if (end == i && cls[i] == CharClass::kLetter) {  // [^\r\n\p{L}\p{N}]?\p{L}+, no prefix
      end = run_end(i, CharClass::kLetter);
    } else if (end == i && cls[i] != CharClass::kNumber && !newline(i) && i + 1 < n &&
               cls[i + 1] == CharClass::kLetter) {  // ... with its one-character prefix
      end = run_end(i + 1, CharClass::kLetter);
    } else if (end == i && cls[i] == CharClass::kNumber) {  // \p{N}{1,3}
      end = std::min(run_end(i, CharClass::kNumber), i + 3);
    }
    if (end == i) {  //  ?[^\s\p{L}\p{N}]+[\r\n]*
      const size_t start = cps[i].cp == ' ' && i + 1 < n && cls[i + 1] == CharClass::kOther ? i + 1 : i;
      if (cls[start] == CharClass::kOther) {
        end = run_end(start, CharClass::kOther);
        while (end < n && newline(end)) ++end;
      }
    }
    if (end == i) {  // whitespace: \s*[\r\n]+ up to the run's last newline, else \s+(?!\S), \s+
      const size_t ws_end = run_end(i, CharClass::kSpace);
      size_t last_newline = ws_end;
      for (size_t k = i; k < ws_end; ++k)
        if (newline(k)) last_newline = k;
      if (last_newline < ws_end) end = last_newline + 1;
      else end = (ws_end == n || ws_end - i == 1) ? ws_end : ws_end - 1;
    }
    pieces.push_back(t.piece(i, end));
    i = end;
  }
  return pieces;
}

// The Split patterns we implement, as tokenizer.json spells them.
constexpr std::string_view kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// GPT-2's reversible byte <-> unicode mapping: printable Latin-1 bytes map to themselves, the
// other 68 bytes to U+0100.. in byte order, so that every token is printable text.
struct ByteLevelMap {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 324> cp_to_byte;  // -1 where a code point is no byte's image

  ByteLevelMap() {
    cp_to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool keep =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = keep ? static_cast<uint32_t>(b) : next++;
      append_utf8(byte_to_utf8[b], cp);
      cp_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelMap& byte_level() {
  static const ByteLevelMap map;
  return map;
}

// The ByteLevel decoder: a token whose characters are all byte images becomes those bytes;
// any other token (e.g. an added token with a plain space) is taken as it is.
void append_token_bytes(std::string& out, const std::string& token) {
  const ByteLevelMap& map = byte_level();
  std::string bytes;
  for (size_t pos = 0; pos < token.size();) {
    const CodePoint cp = decode_utf8(token, pos);
    if (cp.cp >= map.cp_to_byte.size() || map.cp_to_byte[cp.cp] < 0) {
      out += token;
      return;
    }
    bytes += static_cast<char>(map.cp_to_byte[cp.cp]);
    pos += cp.len;
  }
  out += bytes;
}

// ---- tokenizer.json parsing helpers --------------------------------------------------------

constexpr int64_t kMaxVocab = int64_t{1} << 24;

const json* member(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

bool get_bool(const json& obj, const char* key, bool fallback, const std::string& where) {
  const json* v = member(obj, key);
  if (!v) return fallback;
  if (!v->is_boolean())
    throw Error(str(where, ": '", key, "' must be a boolean, got ", v->type_name()));
  return v->get<bool>();
}

std::string get_string(const json& obj, const char* key, const std::string& where) {
  const json* v = member(obj, key);
  if (!v) throw Error(str(where, ": missing '", key, "'"));
  if (!v->is_string())
    throw Error(str(where, ": '", key, "' must be a string, got ", v->type_name()));
  return v->get<std::string>();
}

int32_t get_id(const json& v, const std::string& where) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= kMaxVocab)
    throw Error(str(where, " must be an integer id in [0, ", kMaxVocab, "), got ",
                    printable(v.dump(), 40)));
  return static_cast<int32_t>(v.get<int64_t>());
}

std::string type_of(const json& obj, const std::string& where) {
  if (!obj.is_object()) throw Error(str(where, " must be an object, got ", obj.type_name()));
  return get_string(obj, "type", where);
}

// The special tokens a post-processor puts around a text (HF's add_special_tokens=True): at most one
// before it (BOS) and one after it (EOS). A template with more, or with text that is not the
// sequence itself, is refused rather than half followed.
struct TemplateEnds {
  std::optional<int32_t> first, last;
};

// The id of special token `name` of a TemplateProcessing, checked against the vocabulary.
int32_t template_token_id(const json& pp, const std::string& name, const BpeTokenizer& tok, const std::string& where) {
  const json* specials = member(pp, "special_tokens");
  const json* entry = specials && specials->is_object() ? member(*specials, name.c_str()) : nullptr;
  const json* ids = entry && entry->is_object() ? member(*entry, "ids") : nullptr;
  if (!ids || !ids->is_array() || ids->size() != 1)
    throw Error(str(where, ": the template's token '", printable(name, 60), "' needs one id in special_tokens['",
                    printable(name, 60), "'].ids"));
  const int32_t id = get_id((*ids)[0], where + ".special_tokens");
  if (tok.token_to_id(name) != id)
    throw Error(str(where, ": the template's token '", printable(name, 60), "' (id ", id,
                    ") is not that token of the vocabulary"));
  return id;
}

TemplateEnds template_ends(const json* pp, const BpeTokenizer& tok, const std::string& where) {
  if (!pp) return {};
  const std::string type = type_of(*pp, where);
  if (type == "ByteLevel") return {};
  if (type == "Sequence") {
    const json* list = member(*pp, "processors");
    if (!list || !list->is_array()) throw Error(str(where, ": a Sequence needs a 'processors' array"));
    TemplateEnds ends;
    for (size_t i = 0; i < list->size(); ++i) {
      const TemplateEnds e = template_ends(&(*list)[i], tok, str(where, ".processors[", i, "]"));
      if ((e.first && ends.first && *e.first != *ends.first) || (e.last && ends.last && *e.last != *ends.last))
        throw Error(str(where, ": two processors put different tokens around a text"));
      if (e.first) ends.first = e.first;
      if (e.last) ends.last = e.last;
    }
    return ends;
  }
  if (type != "TemplateProcessing")
    throw Error(str(where, ": unsupported post-processor '", printable(type, 40),
                    "' (supported: null, ByteLevel, TemplateProcessing, a Sequence of them)"));
  const json* single = member(*pp, "single");
  if (!single || !single->is_array() || single->empty())
    throw Error(str(where, ": TemplateProcessing needs a non-empty 'single' template"));
  TemplateEnds ends;
  bool text_seen = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const json& item = (*single)[i];
    const std::string at = str(where, ".single[", i, "]");
    const json* special = item.is_object() ? member(item, "SpecialToken") : nullptr;
    const json* sequence = item.is_object() ? member(item, "Sequence") : nullptr;
    if (sequence && !text_seen) {
      text_seen = true;
      continue;
    }
    if (!special)
      throw Error(str(at, ": unsupported template item ", printable(item.dump(), 60),
                      " (supported: [special token,] the text [, special token])"));
    const std::string name = special->is_object() ? get_string(*special, "id", at) : "";
    std::optional<int32_t>& slot = text_seen ? ends.last : ends.first;
    if (slot)
      throw Error(str(at, ": a second special token '", printable(name, 60), "' ", text_seen ? "after" : "before",
                      " the text (supported: one on each side)"));
    slot = template_token_id(*pp, name, tok, where);
  }
  if (!text_seen) throw Error(str(where, ": the 'single' template has no text (Sequence) in it"));
  return ends;
}

// Llama 2's tokenizer.json, recognised exactly (anything else is refused by name):
//   normalizer Sequence[Prepend "▁", Replace " " -> "▁"]
//   decoder    Sequence[Replace "▁" -> " ", ByteFallback, Fuse, Strip " " start 1 stop 0]
constexpr const char* kMetaspace = "\xE2\x96\x81";  // U+2581 "▁"

// Llama 2's normalizer: "▁" in front of a non-empty text (unless not `prepend`) and in place of every
// space; the Metaspace pre-tokenizer's step too.
std::string metaspace_normalized(std::string_view text, bool prepend = true) {
  std::string out;
  if (text.empty()) return out;
  if (prepend) out = kMetaspace;
  for (char c : text) {
    if (c == ' ') out += kMetaspace;
    else out += c;
  }
  return out;
}

bool is_string_pattern(const json& step, const char* pattern, const char* content) {
  const json* p = member(step, "pattern");
  const json* s = p && p->is_object() ? member(*p, "String") : nullptr;
  const json* c = member(step, "content");
  return s && s->is_string() && *s == pattern && c && c->is_string() && *c == content;
}

bool is_llama2_normalizer(const json& n) {
  const json* list = n.is_object() ? member(n, "normalizers") : nullptr;
  if (!list || !list->is_array() || list->size() != 2 || !member(n, "type") || n["type"] != "Sequence") return false;
  const json& prepend = (*list)[0];
  const json& replace = (*list)[1];
  return prepend.is_object() && prepend.value("type", "") == "Prepend" && prepend.value("prepend", "") == kMetaspace &&
         replace.is_object() && replace.value("type", "") == "Replace" && is_string_pattern(replace, " ", kMetaspace);
}

bool is_llama2_decoder(const json& d) {
  const json* list = d.is_object() ? member(d, "decoders") : nullptr;
  if (!list || !list->is_array() || list->size() != 4 || !member(d, "type") || d["type"] != "Sequence") return false;
  for (const json& step : *list)
    if (!step.is_object()) return false;
  const json& strip = (*list)[3];
  return (*list)[0].value("type", "") == "Replace" && is_string_pattern((*list)[0], kMetaspace, " ") &&
         (*list)[1].value("type", "") == "ByteFallback" && (*list)[2].value("type", "") == "Fuse" &&
         strip.value("type", "") == "Strip" && strip.value("content", "") == " " && strip.value("start", -1) == 1 &&
         strip.value("stop", -1) == 0;
}

BpeTokenizer::PreTokenizer parse_pre_tokenizer(const json* node, const std::string& source) {
  const std::string where = source + ": pre_tokenizer";
  if (!node) throw Error(str(where, " is missing: byte-level BPE needs a ByteLevel pre-tokenizer"));
  std::vector<const json*> steps;
  const std::string type = type_of(*node, where);
  if (type == "Sequence") {
    const json* list = member(*node, "pretokenizers");
    if (!list || !list->is_array())
      throw Error(str(where, ": Sequence needs a 'pretokenizers' array"));
    for (const json& step : *list) steps.push_back(&step);
  } else {
    steps.push_back(node);
  }
  BpeTokenizer::PreTokenizer pre;
  bool seen_byte_level = false;
  for (const json* step : steps) {
    const std::string step_type = type_of(*step, where);
    if (step_type == "Digits" && !seen_byte_level) {
      pre.digits = get_bool(*step, "individual_digits", false, where)
                       ? BpeTokenizer::PreTokenizer::Digits::kIndividual
                       : BpeTokenizer::PreTokenizer::Digits::kContiguous;
    } else if (step_type == "Split" && !seen_byte_level && !pre.llama3_split) {
      const json* pattern = member(*step, "pattern");
      const json* regex = pattern && pattern->is_object() ? member(*pattern, "Regex") : nullptr;
      const json* behavior = member(*step, "behavior");
      if (!regex || !regex->is_string() || regex->get<std::string>() != kLlama3Pattern || !behavior ||
          *behavior != "Isolated" || get_bool(*step, "invert", false, where))
        throw Error(str(where, ": unsupported pre-tokenizer 'Split' ",
                        printable(pattern ? pattern->dump() : std::string("without a pattern"), 60),
                        " (supported: the Llama-3 regex, behavior Isolated, not inverted)"));
      pre.llama3_split = true;
    } else if (step_type == "ByteLevel" && !seen_byte_level) {
      seen_byte_level = true;
      pre.add_prefix_space = get_bool(*step, "add_prefix_space", true, where);
      pre.use_regex = get_bool(*step, "use_regex", true, where);
    } else {
      throw Error(str(where, ": unsupported pre-tokenizer '", printable(step_type, 40),
                      "' (supported: ByteLevel, optionally after Digits or the Llama-3 Split)"));
    }
  }
  if (!seen_byte_level)
    throw Error(str(where, ": no ByteLevel step (byte-level BPE needs one; SentencePiece-style BPE, as Llama 2 ships it, has no "
                    "pre-tokenizer and Llama 2's normalizer instead)"));
  return pre;
}

// Parses one entry of model.merges: "a b" or ["a", "b"].
std::pair<std::string, std::string> parse_merge(const json& m, size_t rank,
                                                const std::string& source) {
  const std::string where = str(source, ": model.merges[", rank, "]");
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == s.size() ||
        s.find(' ', space + 1) != std::string::npos)
      throw Error(
          str(where, ": '", printable(s, 60), "' is not two tokens separated by one space"));
    return {s.substr(0, space), s.substr(space + 1)};
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
    return {m[0].get<std::string>(), m[1].get<std::string>()};
  throw Error(str(where, ": must be \"a b\" or [\"a\", \"b\"], got ", printable(m.dump(), 60)));
}

// Leftmost-longest matches of `tokens` in `text`, as HF's AddedVocabulary::find_matches.
struct Segment {
  std::string_view text;
  int32_t id;  // -1: plain text
};

bool is_word_char(uint32_t cp) {
  if (cp < 0x80) return cp == '_' || (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
  return in_ranges(std::begin(kWordRanges), std::end(kWordRanges), cp);
}

uint32_t last_cp(std::string_view s) {
  size_t pos = s.size() - 1;
  while (pos > 0 && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) --pos;
  return decode_utf8(s, pos).cp;
}

void split_added(std::string_view text, const std::vector<const BpeTokenizer::AddedToken*>& tokens,
                 std::vector<Segment>& out) {
  if (tokens.empty() || text.empty()) {
    if (!text.empty()) out.push_back({text, -1});
    return;
  }
  std::array<bool, 256> starts{};  // the tokens' first bytes: elsewhere no token is compared (Llama 3 has 256)
  for (const auto* t : tokens)
    if (!t->content.empty()) starts[static_cast<unsigned char>(t->content[0])] = true;
  size_t done = 0;  // text before this is already in `out`
  size_t pos = 0;
  while (pos < text.size()) {
    if (!starts[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    const BpeTokenizer::AddedToken* best = nullptr;
    for (const auto* t : tokens) {
      if (t->content.size() > (best ? best->content.size() : 0) &&
          text.compare(pos, t->content.size(), t->content) == 0)
        best = t;
    }
    if (!best) {
      ++pos;
      continue;
    }
    // As HF's find_matches: the matches are those of the text (the search goes on from a token's own
    // end), widened after: lstrip takes the whitespace before it that no earlier piece took, rstrip
    // the whitespace after it, and the next piece starts where this one stops. So a token starting
    // inside the whitespace an rstrip token took (" spacey", "\n") is a token too, and the text after
    // it is text again; one that lstrip leaves empty is no token (HF drops empty pieces; where HF
    // would fail, an lstrip token wholly inside the earlier piece, twell drops it too).
    size_t start = pos, stop = pos + best->content.size();
    pos = stop;
    if (best->single_word) {
      const bool word_before = start > 0 && is_word_char(last_cp(text.substr(0, start)));
      const bool word_after = stop < text.size() && is_word_char(decode_utf8(text, stop).cp);
      if (word_before || word_after) continue;
    }
    if (best->lstrip) {
      while (start > 0) {
        size_t prev = start - 1;
        while (prev > 0 && (static_cast<unsigned char>(text[prev]) & 0xC0) == 0x80) --prev;
        const CodePoint cp = decode_utf8(text, prev);
        if (prev + cp.len != start || !is_space(cp.cp)) break;
        start = prev;
      }
      start = std::max(start, done);
      if (start >= stop) continue;  // nothing of it left after the earlier piece
    }
    if (best->rstrip) {
      while (stop < text.size()) {
        const CodePoint cp = decode_utf8(text, stop);
        if (!is_space(cp.cp)) break;
        stop += cp.len;
      }
    }
    if (done < start) out.push_back({text.substr(done, start - done), -1});
    out.push_back({text.substr(start, stop - start), best->id});
    done = stop;
  }
  if (done < text.size()) out.push_back({text.substr(done), -1});
}

}  // namespace

// ---- BpeTokenizer ---------------------------------------------------------------------------

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_file(const std::string& path) {
  const std::string text = io::detail::read_text_file(path);
  return from_json(text, path);
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_json(std::string_view text,
                                                      const std::string& source) {
  const json root = io::detail::parse_json_strict(text.data(), text.data() + text.size(), source,
                                                  "tokenizer.json");
  if (!root.is_object())
    throw Error(str(source, ": tokenizer.json must be a JSON object, got ", root.type_name()));
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());

  // model
  const json* model = member(root, "model");
  if (!model) throw Error(str(source, ": missing 'model'"));
  const std::string where = source + ": model";
  const std::string model_type = type_of(*model, where);
  if (model_type != "BPE")
    throw Error(str(where, ": unsupported model type '", printable(model_type, 40),
                    "' (supported: BPE, byte-level as GPT-2 and Llama 3 ship it, or SentencePiece-style as Llama 2 does)"));
  if (const json* dropout = member(*model, "dropout")) {
    if (!dropout->is_number() || dropout->get<double>() != 0.0)
      throw Error(str(where, ": dropout ", printable(dropout->dump(), 20),
                      " is not supported (must be null)"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = member(*model, key);
    if (v && !(v->is_string() && v->get_ref<const std::string&>().empty()))
      throw Error(str(where, ": '", key, "' is not supported by byte-level BPE (must be null)"));
  }
  tok->ignore_merges_ = get_bool(*model, "ignore_merges", false, where);
  tok->fuse_unk_ = get_bool(*model, "fuse_unk", false, where);

  const json* vocab = member(*model, "vocab");
  if (!vocab || !vocab->is_object())
    throw Error(str(where, ": 'vocab' must be an object of token -> id"));
  int32_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const int32_t id = get_id(it.value(), str(where, ".vocab['", printable(it.key(), 60), "']"));
    tok->vocab_.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }

  // added_tokens
  if (const json* added = member(root, "added_tokens")) {
    if (!added->is_array()) throw Error(str(source, ": 'added_tokens' must be an array"));
    for (size_t i = 0; i < added->size(); ++i) {
      const json& a = (*added)[i];
      const std::string w = str(source, ": added_tokens[", i, "]");
      if (!a.is_object()) throw Error(str(w, " must be an object"));
      AddedToken t;
      t.content = get_string(a, "content", w);
      const json* id = member(a, "id");
      if (!id) throw Error(str(w, ": missing 'id'"));
      t.id = get_id(*id, w + ".id");
      t.special = get_bool(a, "special", false, w);
      t.normalized = get_bool(a, "normalized", !t.special, w);
      t.lstrip = get_bool(a, "lstrip", false, w);
      t.rstrip = get_bool(a, "rstrip", false, w);
      t.single_word = get_bool(a, "single_word", false, w);
      if (t.content.empty()) throw Error(str(w, ": empty 'content'"));
      if (!tok->vocab_.count(t.content)) tok->added_only_.insert(t.content);
      tok->vocab_[t.content] = t.id;
      max_id = std::max(max_id, t.id);
      tok->added_.push_back(std::move(t));
    }
  }
  if (max_id < 0) throw Error(str(where, ": empty vocabulary"));
  tok->vocab_size_ = max_id + 1;
  tok->token_index_.assign(static_cast<size_t>(tok->vocab_size_), kNoToken);
  tok->tokens_.reserve(tok->vocab_.size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const int32_t id = it.value().get<int32_t>();
    if (tok->has_id(id))
      throw Error(str(where, ".vocab: id ", id, " is given to both '",
                      printable(tok->token_of(id), 60), "' and '", printable(it.key(), 60),
                      "'"));
    tok->set_token(id, it.key());
  }
  for (const AddedToken& t : tok->added_) tok->set_token(t.id, t.content);  // an added token may reuse a model id

  if (const json* unk = member(*model, "unk_token")) {
    if (!unk->is_string()) throw Error(str(where, ": 'unk_token' must be a string or null"));
    auto it = tok->vocab_.find(unk->get<std::string>());
    if (it == tok->vocab_.end())
      throw Error(str(where, ": unk_token '", printable(unk->get<std::string>(), 60),
                      "' is not in the vocabulary"));
    tok->unk_ = it->second;
  }

  // merges: rank = position; a later duplicate of a pair replaces the earlier one, as in HF. Required,
  // as HF requires it: without them every word would split into characters.
  const json* merges = member(*model, "merges");
  if (!merges || !merges->is_array())
    throw Error(str(where, ": 'merges' must be an array (", merges ? "got " + std::string(merges->type_name()) : "missing",
                    "; a BPE without merges splits every word into characters)"));
  tok->merges_.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const auto [a, b] = parse_merge((*merges)[rank], rank, source);
    const auto ia = tok->vocab_.find(a), ib = tok->vocab_.find(b), iab = tok->vocab_.find(a + b);
    for (const auto& [it, name] : {std::pair{ia, &a}, std::pair{ib, &b}}) {
      if (it == tok->vocab_.end())
        throw Error(str(where, ".merges[", rank, "]: token '", printable(*name, 60),
                        "' is not in the vocabulary"));
    }
    if (iab == tok->vocab_.end())
      throw Error(str(where, ".merges[", rank, "]: merged token '", printable(a + b, 60),
                      "' is not in the vocabulary"));
    const uint64_t key =
        (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    tok->merges_[key] = {static_cast<int32_t>(rank), iab->second};
  }

  const TemplateEnds ends = template_ends(member(root, "post_processor"), *tok, source + ": post_processor");
  tok->bos_ = tok->bos_to_add_ = ends.first;
  tok->eos_ = tok->eos_to_add_ = ends.last;

  // normalizer, pre-tokenizer, decoder: byte-level, or SentencePiece-style as Llama 2 ships
  tok->byte_fallback_ = get_bool(*model, "byte_fallback", false, where);
  if (const json* normalizer = member(root, "normalizer")) {
    if (!is_llama2_normalizer(*normalizer))
      throw Error(str(source, ": unsupported normalizer '",
                      printable(type_of(*normalizer, source + ": normalizer"), 40), "' ",
                      printable(normalizer->dump(), 80),
                      " (supported: null, or Llama 2's Sequence[Prepend \"▁\", Replace \" \" -> \"▁\"])"));
    if (member(root, "pre_tokenizer"))
      throw Error(str(source, ": pre_tokenizer must be null with Llama 2's normalizer"));
    const json* decoder = member(root, "decoder");
    if (!decoder || !is_llama2_decoder(*decoder))
      throw Error(str(source, ": decoder must be Llama 2's Sequence[Replace \"▁\" -> \" \", ByteFallback, Fuse, "
                              "Strip 1 leading space] with its normalizer"));
    tok->metaspace_ = true;
    for (const AddedToken& t : tok->added_)
      if (t.normalized) {
        tok->added_metaspace_.push_back(t);
        tok->added_metaspace_.back().content = metaspace_normalized(t.content);
        // HF's id_to_token, and so its decoder, gives such a token's normalized content ("▁<tok>").
        tok->set_token(t.id, tok->added_metaspace_.back().content);
      }
    return tok;
  }
  if (const json* pre = member(root, "pre_tokenizer"); pre && pre->is_object() && pre->value("type", "") == "Metaspace") {
    // The newer SentencePiece layout: no normalizer, Metaspace("▁", not split), Llama 2's decoder.
    const std::string pre_where = source + ": pre_tokenizer Metaspace";
    if (get_string(*pre, "replacement", pre_where) != kMetaspace)
      throw Error(str(pre_where, ": replacement must be \"", kMetaspace, "\" (U+2581)"));
    if (get_bool(*pre, "split", true, pre_where))
      throw Error(str(pre_where, ": split = true is not supported (Llama 2 and Mistral conversions have false)"));
    using P = BpeTokenizer::MetaspacePrepend;
    P prepend = get_bool(*pre, "add_prefix_space", true, pre_where) ? P::kAlways : P::kNever;  // before prepend_scheme
    if (const json* scheme = member(*pre, "prepend_scheme")) {
      const std::string s = scheme->is_string() ? scheme->get<std::string>() : "";
      if (s != "first" && s != "always" && s != "never")
        throw Error(str(pre_where, ": prepend_scheme must be first, always or never, got ", printable(scheme->dump(), 40)));
      prepend = s == "first" ? P::kFirst : s == "always" ? P::kAlways : P::kNever;
    }
    const json* decoder = member(root, "decoder");
    if (!decoder || !is_llama2_decoder(*decoder))
      throw Error(str(source, ": decoder must be Llama 2's Sequence[Replace \"▁\" -> \" \", ByteFallback, Fuse, "
                              "Strip 1 leading space] with a Metaspace pre-tokenizer"));
    tok->metaspace_ = true;
    tok->metaspace_prepend_ = prepend;
    return tok;
  }
  tok->pre_ = parse_pre_tokenizer(member(root, "pre_tokenizer"), source);
  if (const json* decoder = member(root, "decoder")) {
    const std::string decoder_type = type_of(*decoder, source + ": decoder");
    if (decoder_type != "ByteLevel")
      throw Error(str(source, ": decoder: unsupported decoder '", printable(decoder_type, 40),
                      "' (only ByteLevel is supported)"));
  }
  return tok;
}

std::vector<int32_t> BpeTokenizer::special_ids() const {
  std::vector<int32_t> ids;
  for (const AddedToken& t : added_)
    if (t.special) ids.push_back(t.id);
  for (const std::optional<int32_t>& id : {bos_, eos_})
    if (id) ids.push_back(*id);
  ids.insert(ids.end(), more_special_.begin(), more_special_.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

void BpeTokenizer::add_special_ids(const std::vector<int32_t>& ids) {
  for (const int32_t id : ids)
    if (!has_id(id))
      throw Error(str("BpeTokenizer::add_special_ids: id ", id, " is not in the vocabulary"));
  more_special_.insert(more_special_.end(), ids.begin(), ids.end());
}

void BpeTokenizer::set_bos_eos(std::optional<int32_t> bos, std::optional<int32_t> eos, std::optional<bool> add_bos,
                               std::optional<bool> add_eos) {
  for (const auto& id : {bos, eos}) {
    if (id && !has_id(*id))
      throw Error(str("BpeTokenizer::set_bos_eos: id ", *id, " is not in the vocabulary"));
  }
  bos_ = bos;
  eos_ = eos;
  if (add_bos) bos_to_add_ = *add_bos ? bos_ : std::nullopt;
  if (add_eos) eos_to_add_ = *add_eos ? eos_ : std::nullopt;
}

std::string BpeTokenizer::id_to_token(int32_t id) const {
  if (!has_id(id))
    throw Error(str("BpeTokenizer: unknown token id ", id, " (vocab size ", vocab_size_,
                    id >= 0 && id < vocab_size_ ? "; a gap in tokenizer.json's ids" : "", ")"));
  return token_of(id);
}

void BpeTokenizer::set_token(int32_t id, std::string token) {
  uint32_t& at = token_index_[static_cast<size_t>(id)];
  if (at == kNoToken) {
    at = static_cast<uint32_t>(tokens_.size());
    tokens_.push_back(std::move(token));
  } else {
    tokens_[at] = std::move(token);
  }
}

std::optional<int32_t> BpeTokenizer::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size_)
      throw Error(str("BpeTokenizer::decode: unknown token id ", id, " at position ", i,
                      " (vocab size ", vocab_size_, ")"));
    if (!has_id(id)) continue;  // a gap in tokenizer.json's ids: no token, no text (HF's decode skips it too)
    const std::string& token = token_of(id);
    if (!metaspace_) {
      append_token_bytes(out, token);
      continue;
    }
    // Llama 2's decoder: <0xHH> is a byte (its ByteFallback step, whatever the model's byte_fallback), "▁" a
    // space. What HF's u8::from_str_radix(HH, 16) takes: two hex digits, or "+" and one ("<0x+1>" is byte 1);
    // sscanf alone would also take "<0x-1>" and "<0x 1>".
    unsigned byte = 0;
    const auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
    if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>' &&
        (hex(token[3]) || token[3] == '+') && hex(token[4]) &&
        std::sscanf(token.c_str() + 3, "%2x", &byte) == 1) {
      out += static_cast<char>(byte);
      continue;
    }
    for (size_t pos = 0; pos < token.size();) {
      if (token.compare(pos, 3, kMetaspace) == 0) {
        out += ' ';
        pos += 3;
      } else {
        out += token[pos++];
      }
    }
  }
  if (metaspace_ && !out.empty() && out[0] == ' ') out.erase(0, 1);  // Strip: one leading space
  return out;
}

std::unordered_map<std::string, int32_t>::const_iterator BpeTokenizer::model_token(const std::string& s) const {
  const auto it = vocab_.find(s);
  return it == vocab_.end() || added_only_.empty() || !added_only_.count(s) ? it : vocab_.end();
}

// BPE on one word, as HF's Word::merge_all: repeatedly merge the adjacent pair of lowest rank,
// the leftmost first among equals, until no pair has a merge.
std::vector<int32_t> BpeTokenizer::merge_word(const std::string& word) const {
  if (ignore_merges_) {
    auto it = model_token(word);
    if (it != vocab_.end()) return {it->second};
  }
  struct Symbol {
    int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  bool last_was_unk = false;
  for (size_t pos = 0; pos < word.size();) {
    const size_t len = decode_utf8(word, pos).len;
    auto it = model_token(word.substr(pos, len));
    pos += len;
    if (it != vocab_.end()) {
      symbols.push_back({it->second, 0, 0, true});
      last_was_unk = false;
      continue;
    }
    if (byte_fallback_) {  // a character with no token becomes its bytes' <0xHH> tokens, if all exist
      std::vector<int32_t> bytes;
      for (size_t b = pos - len; b < pos; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned char>(word[b]));
        auto bt = model_token(name);
        if (bt == vocab_.end()) break;
        bytes.push_back(bt->second);
      }
      if (bytes.size() == len) {
        for (int32_t id : bytes) symbols.push_back({id, 0, 0, true});
        last_was_unk = false;
        continue;
      }
    }
    if (unk_) {  // characters with no token become unk (runs fused if asked); else dropped
      if (!(fuse_unk_ && last_was_unk)) symbols.push_back({*unk_, 0, 0, true});
      last_was_unk = true;
    }
  }
  const int n = static_cast<int>(symbols.size());
  for (int i = 0; i < n; ++i) {
    symbols[i].prev = i - 1;
    symbols[i].next = i + 1 < n ? i + 1 : -1;
  }

  struct Candidate {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto lookup = [&](int left, int right) -> const std::pair<int32_t, int32_t>* {
    const uint64_t key =
        (static_cast<uint64_t>(symbols[left].id) << 32) | static_cast<uint32_t>(symbols[right].id);
    auto it = merges_.find(key);
    return it == merges_.end() ? nullptr : &it->second;
  };
  const auto push = [&](int left) {
    if (left < 0 || symbols[left].next < 0) return;
    if (const auto* m = lookup(left, symbols[left].next)) queue.push({m->first, left, m->second});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    const auto* m = lookup(top.pos, left.next);
    if (!m || m->second != top.new_id) continue;  // stale: a neighbour has merged since
    Symbol& right = symbols[left.next];
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    push(left.prev);
    push(top.pos);
  }
  std::vector<int32_t> ids;
  for (int i = 0; i >= 0 && i < n; i = symbols[i].next) ids.push_back(symbols[i].id);
  return ids;
}

void BpeTokenizer::encode_word(const std::string& word, std::vector<int32_t>& out) const {
  constexpr size_t kMaxCachedWord = 256, kMaxCacheEntries = 1 << 16;
  const bool cacheable = word.size() <= kMaxCachedWord;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = merge_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(word, std::move(ids));
  }
}

// Text between added tokens: Digits or the Llama-3 Split (if configured), then ByteLevel on each
// resulting split.
void BpeTokenizer::encode_plain(std::string_view text, bool at_start, std::vector<int32_t>& out) const {
  if (metaspace_ && metaspace_prepend_ != MetaspacePrepend::kNormalizer) {
    // Metaspace, not split: spaces to "▁", and "▁" in front where the scheme asks and there is none.
    if (text.empty()) return;
    const bool wanted = metaspace_prepend_ == MetaspacePrepend::kAlways ||
                        (metaspace_prepend_ == MetaspacePrepend::kFirst && at_start);
    const std::vector<int32_t> ids =
        merge_word(metaspace_normalized(text, wanted && text[0] != ' ' && text.compare(0, 3, kMetaspace) != 0));
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  if (metaspace_) {
    // HF normalizes the segment, matches the normalized added tokens in it (their content
    // normalized alike: "▁<tok>"), and sends each piece between them to the model as one word.
    const std::string normalized = metaspace_normalized(text);
    std::vector<const AddedToken*> tokens;
    for (const AddedToken& t : added_metaspace_) tokens.push_back(&t);
    std::vector<Segment> parts;
    split_added(normalized, tokens, parts);
    for (const Segment& part : parts) {
      if (part.id >= 0) {
        out.push_back(part.id);
      } else {
        const std::vector<int32_t> ids = merge_word(std::string(part.text));
        out.insert(out.end(), ids.begin(), ids.end());
      }
    }
    return;
  }
  std::vector<std::string_view> splits;
  if (pre_.llama3_split) {
    splits = llama3_split(text);
  } else if (pre_.digits == PreTokenizer::Digits::kKeep) {
    splits.push_back(text);
  } else {
    const bool individual = pre_.digits == PreTokenizer::Digits::kIndividual;
    size_t start = 0;
    bool prev_digit = false;
    for (size_t pos = 0; pos < text.size();) {
      const CodePoint cp = decode_utf8(text, pos);
      const bool digit = cp.cp != kInvalid && is_numeric_char(cp.cp);
      if (pos > start && (digit != prev_digit || (digit && individual))) {
        splits.push_back(text.substr(start, pos - start));
        start = pos;
      }
      prev_digit = digit;
      pos += cp.len;
    }
    if (start < text.size()) splits.push_back(text.substr(start));
  }

  const ByteLevelMap& map = byte_level();
  std::string prefixed, word;
  for (std::string_view split : splits) {
    if (split.empty()) continue;
    if (pre_.add_prefix_space && split[0] != ' ') {
      prefixed = " ";
      prefixed += split;
      split = prefixed;
    }
    std::vector<std::string_view> pieces;
    if (pre_.use_regex) {
      pieces = gpt2_split(split);
    } else {
      pieces.push_back(split);
    }
    for (std::string_view piece : pieces) {
      word.clear();
      for (unsigned char c : piece) word += map.byte_to_utf8[c];
      encode_word(word, out);
    }
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  // Added tokens that match the raw text go first, then those matched after normalization, as
  // HF's AddedVocabulary does: with no normalizer in the same text, with Llama 2's in encode_plain.
  std::vector<const AddedToken*> raw, normalized;
  for (const AddedToken& t : added_) (t.normalized ? normalized : raw).push_back(&t);
  std::vector<Segment> first, segments;
  split_added(text, raw, first);
  for (const Segment& s : first) {
    if (s.id >= 0 || (metaspace_ && metaspace_prepend_ == MetaspacePrepend::kNormalizer)) {
      segments.push_back(s);
    } else {
      split_added(s.text, normalized, segments);
    }
  }
  std::vector<int32_t> ids;
  for (const Segment& s : segments) {
    if (s.id >= 0) {
      ids.push_back(s.id);
    } else {
      encode_plain(s.text, s.text.data() == text.data(), ids);
    }
  }
  return ids;
}

size_t first_invalid_utf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const CodePoint cp = decode_utf8(text, pos);
    if (cp.cp == kInvalid) return pos;
    pos += cp.len;
  }
  return std::string_view::npos;
}

namespace {

// Where a well-formed sequence may begin at `pos`: its length (0 where the byte begins none: a
// continuation, C0, C1, F5..FF) and how many of the bytes from `pos` still continue some well-formed
// sequence, its maximal subpart (at least 1; the second byte's range depends on the lead, Unicode's
// Table 3-7). A whole character where `take` equals `len`.
struct Utf8Start {
  size_t len, take;
};
Utf8Start utf8_start(std::string_view s, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = byte(pos);
  const size_t len = lead < 0x80 ? 1 : lead >= 0xC2 && lead <= 0xF4 ? utf8_length(lead) : 0;
  size_t take = 1;
  if (len > 1 && pos + 1 < s.size()) {
    const unsigned char second = byte(pos + 1);
    const unsigned char lo = lead == 0xE0 ? 0xA0 : lead == 0xF0 ? 0x90 : 0x80;
    const unsigned char hi = lead == 0xED ? 0x9F : lead == 0xF4 ? 0x8F : 0xBF;
    if (second >= lo && second <= hi)
      for (take = 2; take < len && pos + take < s.size() && (byte(pos + take) & 0xC0) == 0x80;) ++take;
  }
  return {len, take};
}

}  // namespace

std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const CodePoint cp = decode_utf8(text, pos);
    if (cp.cp != kInvalid) {
      out.append(text.substr(pos, cp.len));
      pos += cp.len;
      continue;
    }
    // The maximal subpart (Unicode's "U+FFFD substitution of maximal subparts", as Python's
    // errors="replace" and Rust's from_utf8_lossy).
    out += "\xEF\xBF\xBD";  // U+FFFD
    pos += utf8_start(text, pos).take;
  }
  return out;
}

// ---- load_tokenizer -------------------------------------------------------------------------

namespace {

// tokenizer_config.json names BOS/EOS as a string or as {"content": "..."}.
std::optional<int32_t> special_from_config(const json& config, const char* key,
                                           const BpeTokenizer& tok, const std::string& source) {
  const json* v = member(config, key);
  if (!v) return std::nullopt;
  const json* content = v->is_object() ? member(*v, "content") : v;
  if (!content || !content->is_string())
    throw Error(str(source, ": '", key, "' must be a string or {\"content\": string}"));
  const std::optional<int32_t> id = tok.token_to_id(content->get<std::string>());
  if (!id)
    throw Error(str(source, ": ", key, " '", printable(content->get<std::string>(), 60),
                    "' is not in the tokenizer's vocabulary"));
  return id;
}

}  // namespace

bool has_tokenizer_file(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir(model_dir);
  return fs::exists(fs::symlink_status(dir / "tokenizer.json", ec)) || fs::exists(dir / "tokenizer.model", ec);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  const fs::path json_path = dir / "tokenizer.json";
  std::error_code ec;
  if (fs::exists(json_path, ec) && !fs::is_regular_file(json_path, ec))
    throw Error(str(json_path.string(), ": not a regular file (a directory?)"));
  if (std::string link = io::detail::dangling_link(json_path.string()); !link.empty()) throw Error(link);
  if (!fs::is_regular_file(json_path, ec)) {
    std::string hint;
    if (fs::exists(dir / "tokenizer.model", ec))
      hint = "; tokenizer.model (SentencePiece) is there but not supported";
    throw Error(str(model_dir, ": no tokenizer: looked for ", json_path.string(),
                    " (HuggingFace byte-level BPE)", hint));
  }
  std::unique_ptr<BpeTokenizer> tok = BpeTokenizer::from_file(json_path.string());
  const fs::path config_path = dir / "tokenizer_config.json";
  // Not skipped where it is no regular file (a directory, a FIFO): read_text_file says so. It says where BOS goes.
  if (fs::exists(config_path, ec)) {
    const std::string source = config_path.string();
    const std::string text = io::detail::read_text_file(source);
    const json config = io::detail::parse_json_strict(text.data(), text.data() + text.size(),
                                                      source, "tokenizer_config.json", 64);
    if (!config.is_object())
      throw Error(str(source, ": tokenizer_config.json must be a JSON object"));
    // Whether BOS goes in front of a text, as transformers 5 decides it: add_bos_token where given;
    // true for the Llama-family tokenizer classes, which rebuild the template from it (default
    // true); false where only add_eos_token is given (the template is rebuilt, the missing flag
    // false); otherwise what tokenizer.json's post-processor does.
    auto flag = [&](const char* key) -> std::optional<bool> {
      const json* v = member(config, key);
      if (!v) return std::nullopt;
      if (!v->is_boolean()) throw Error(str(source, ": '", key, "' must be true or false"));
      return v->get<bool>();
    };
    static const char* const kBosByDefault[] = {"LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer",
                                                "CodeLlamaTokenizerFast", "GemmaTokenizer", "GemmaTokenizerFast"};
    const json* cls = member(config, "tokenizer_class");
    const bool llama_class =
        cls && cls->is_string() &&
        std::find(std::begin(kBosByDefault), std::end(kBosByDefault), cls->get<std::string>()) !=
            std::end(kBosByDefault);
    std::optional<bool> add_bos = flag("add_bos_token"), add_eos = flag("add_eos_token");
    const bool rebuilt = add_bos || add_eos || llama_class;  // the template made again from the flags
    if (!add_bos && llama_class) add_bos = true;
    if (!add_bos && rebuilt) add_bos = false;
    if (!add_eos && rebuilt) add_eos = false;
    const std::optional<int32_t> bos = special_from_config(config, "bos_token", *tok, source);
    const std::optional<int32_t> bos_id = bos ? bos : tok->bos_id();
    if (add_bos.value_or(false) && !bos_id)
      throw Error(str(source, ": BOS is to be added (add_bos_token, or a Llama tokenizer class) but no bos_token "
                              "is named"));
    const std::optional<int32_t> eos = special_from_config(config, "eos_token", *tok, source);
    const std::optional<int32_t> eos_id = eos ? eos : tok->eos_id();
    if (add_eos.value_or(false) && !eos_id)
      throw Error(str(source, ": EOS is to be added (add_eos_token) but no eos_token is named"));
    tok->set_bos_eos(bos_id, eos_id, add_bos, add_eos);
    // What else transformers makes special (decode(skip_special_tokens=True) leaves it out): the other named
    // special tokens that the vocabulary holds, and added_tokens_decoder's entries marked special.
    std::vector<int32_t> special;
    for (const char* key : {"unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}) {
      const json* v = member(config, key);
      const json* content = v && v->is_object() ? member(*v, "content") : v;
      if (content && content->is_string())
        if (const std::optional<int32_t> id = tok->token_to_id(content->get<std::string>())) special.push_back(*id);
    }
    if (const json* decoder = member(config, "added_tokens_decoder"); decoder && decoder->is_object())
      for (const auto& [key, entry] : decoder->items()) {
        const json* marked = entry.is_object() ? member(entry, "special") : nullptr;
        const json* content = entry.is_object() ? member(entry, "content") : nullptr;
        if (!marked || !marked->is_boolean() || !marked->get<bool>() || !content || !content->is_string()) continue;
        if (const std::optional<int32_t> id = tok->token_to_id(content->get<std::string>())) special.push_back(*id);
      }
    tok->add_special_ids(special);
  }
  return tok;
}

namespace {

// The length of `s` without a UTF-8 character that has begun but not ended at its end: a lead in the
// last three bytes whose sequence is longer than what follows it, all of which may still continue it.
// (Bytes that cannot, as F0 80, are passed on now as U+FFFD, not held for the next piece.)
size_t whole_utf8_prefix(std::string_view s) {
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const size_t pos = s.size() - back;
    if ((static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) continue;  // a continuation byte: its lead is further back
    const Utf8Start start = utf8_start(s, pos);
    return start.len > back && start.take == back ? pos : s.size();
  }
  return s.size();  // ASCII, or continuation bytes alone (not UTF-8: passed on)
}

}  // namespace

TextStream::TextStream(const Tokenizer& tok, std::vector<int32_t> context, std::vector<int32_t> stops)
    : tok_(tok), ids_(std::move(context)), stops_(std::move(stops)), given_(ids_.size()) {
  for (const int32_t id : ids_)  // stop ids are only compared: a model's may lie past its tokenizer's
    TWELL_REQUIRE(id >= 0 && id < tok_.vocab_size(), "TextStream: context id ", id, " is outside the tokenizer's [0, ",
                tok_.vocab_size(), ")");
}

void TextStream::skip_special_tokens() {
  TWELL_REQUIRE(!started_, "TextStream: special tokens are skipped from before the first token");
  const std::vector<int32_t> special = tok_.special_ids();  // ascending
  ids_.erase(std::remove_if(ids_.begin(), ids_.end(),
                            [&](int32_t id) { return std::binary_search(special.begin(), special.end(), id); }),
             ids_.end());
  given_ = ids_.size();
  stops_.insert(stops_.end(), special.begin(), special.end());
}

std::string TextStream::put(int32_t id) {
  if (stopped() || std::find(stops_.begin(), stops_.end(), id) != stops_.end()) {  // not part of the text
    started_ = true;
    return {};
  }
  const size_t first = given_ > kWindow ? given_ - kWindow : 0;
  const std::vector<int32_t> before(ids_.begin() + first, ids_.begin() + given_);
  std::vector<int32_t> all(ids_.begin() + first, ids_.end());
  all.push_back(id);
  const std::string known = tok_.decode(before), now = tok_.decode(all);  // may throw: nothing changed yet
  started_ = true;
  ids_.push_back(id);
  given_ = ids_.size();
  // Drop what no window reads again, so the ids kept stay few.
  if (ids_.size() > 4 * kWindow) {
    ids_.erase(ids_.begin(), ids_.end() - kWindow);
    given_ = ids_.size();
  }
  if (now.size() > known.size()) held_ += now.substr(known.size());
  const size_t whole = whole_utf8_prefix(held_);
  std::string piece = valid_utf8(std::string_view(held_).substr(0, whole));
  held_.erase(0, whole);
  return cut(std::move(piece));
}

std::string TextStream::finish() {
  // Not searched for stop strings: the generation has ended already, for another reason, which its
  // caller reports; the text should agree with it.
  std::string rest = valid_utf8(std::exchange(held_, std::string()));
  if (stopped()) return {};
  return std::exchange(pending_, std::string()) + rest;
}

void TextStream::check_stop_strings(const std::vector<std::string>& strings) {
  for (const std::string& s : strings) {
    TWELL_REQUIRE(!s.empty(), "a stop string must not be empty");
    TWELL_REQUIRE(first_invalid_utf8(s) == std::string::npos, "stop string \"", valid_utf8(s),
                  "\" is not valid UTF-8 (the generated text always is, so it could never be met)");
  }
}

void TextStream::stop_at(std::vector<std::string> strings) {
  TWELL_REQUIRE(!started_, "TextStream: stop strings are given before the first token");
  check_stop_strings(strings);
  stop_strings_ = std::move(strings);
}

std::string TextStream::cut(std::string piece) {  // put() gives nothing once stopped: never called then
  if (stop_strings_.empty()) return piece;
  pending_ += piece;
  // The earliest place a stop string starts (the first given among those starting there).
  size_t at = std::string::npos;
  for (size_t k = 0; k < stop_strings_.size(); ++k)
    if (const size_t p = pending_.find(stop_strings_[k]); p < at) at = p, stopped_index_ = static_cast<int64_t>(k);
  if (at != std::string::npos) {
    std::string shown = pending_.substr(0, at);
    pending_.clear();
    return shown;
  }
  // Hold back the longest end of the text that a stop string begins with. It starts on a character's
  // first byte: a valid UTF-8 string does not begin with a continuation byte.
  size_t keep = 0;
  for (const std::string& s : stop_strings_)
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > keep; --n)
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  std::string shown = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return shown;
}

}  // namespace twell::model
