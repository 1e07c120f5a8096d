// Data pipeline: tokenizer, .mo reader, prep gettext / prep text, dataset files, batcher.
// Oracles: hand-written expected values (exact), catalogs compiled by GNU msgfmt from .po text
// written here, FNV-1a reference vectors, and a brute-force re-derivation of packing properties.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/philox.hpp"
#include "data/batcher.hpp"
#include "data/mo_file.hpp"
#include "data/prep.hpp"
#include "app/prep_cli.hpp"
#include "data/tokenizer.hpp"
#include "io/h5.hpp"
#include "../test_util.hpp"
#include "../support/h5_support.hpp"
#include "support/h5_mutate.hpp"

using namespace meshmoe;
namespace fs = std::filesystem;

namespace {

// A fresh directory of this rank (these tests are not [mpi]; each rank works alone).
std::string fresh_dir(const std::string& name) {
  const fs::path d = fs::path(test::scratch_dir()) /
                     ("data-" + name + "-r" + std::to_string(test::world_rank()) + "-" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

void write_text(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}
std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Compiles .po text with GNU msgfmt (extra = e.g. "--endianness=big").
void msgfmt(const std::string& po_text, const std::string& mo_path, const std::string& extra = "") {
  const std::string po = mo_path + ".po";
  write_text(po, "msgid \"\"\nmsgstr \"Content-Type: text/plain; charset=UTF-8\\n\"\n\n" + po_text);
  const std::string cmd = "msgfmt " + extra + " -o '" + mo_path + "' '" + po + "'";
  REQUIRE(std::system(cmd.c_str()) == 0);
  fs::remove(po);
}

const char* kCatalogPo =
    "msgid \"Open\"\nmsgstr \"Öffnen\"\n\n"
    "msgid \"Close\"\nmsgstr \"Schließen\"\n\n"
    "msgid \"File\"\nmsgstr \"File\"\n\n"  // identical to English
    "msgid \"Save\"\nmsgstr \"\"\n\n"      // untranslated: msgfmt leaves it out
    "#, fuzzy\nmsgid \"Quit\"\nmsgstr \"Beenden\"\n\n"  // fuzzy: msgfmt leaves it out
    "msgctxt \"menu\"\nmsgid \"Open\"\nmsgstr \"Öffnen\"\n\n"
    "msgid \"%d file\"\nmsgid_plural \"%d files\"\nmsgstr[0] \"%d Datei\"\nmsgstr[1] \"%d Dateien\"\n\n";

std::multiset<std::pair<std::string, std::string>> as_set(const MoCatalog& c) {
  std::multiset<std::pair<std::string, std::string>> s;
  for (const auto& e : c.entries) s.insert({e.msgid, e.msgstr});
  return s;
}

}  // namespace

TEST_CASE("tokenizer: bytes, specials and sorted language tags", "[data]") {
  const Tokenizer tok({"sr@latin", "pt_BR", "de"});
  CHECK(tok.vocab_size() == 263);
  CHECK(tok.languages() == std::vector<std::string>{"de", "pt_BR", "sr@latin"});
  CHECK(tok.lang_token("de") == 260);
  CHECK(tok.lang_token("pt_BR") == 261);
  CHECK(tok.lang_token("sr@latin") == 262);
  CHECK(tok.language_index("fr") == -1);
  CHECK_THROWS_AS(tok.lang_token("fr"), InputError);
  CHECK_THROWS_AS(Tokenizer({"a b"}), InputError);

  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  all += "Grüße, мир";
  const auto ids = tok.encode(all);
  REQUIRE(ids.size() == all.size());
  for (int b = 0; b < 256; ++b) CHECK(ids[size_t(b)] == b);
  CHECK(tok.decode(ids) == all);

  CHECK(tok.decode({261, 'o', 'i', 259, 'h', 'i', 258, 256, 257}) == "<pt_BR>oi<sep>hi<eos><pad><bos>");
  CHECK_THROWS_AS(tok.decode({263}), Error);
  CHECK_THROWS_AS(tok.decode({-1}), Error);
}

TEST_CASE("fnv1a64 matches the reference vectors", "[data]") {
  CHECK(fnv1a64("") == 0xcbf29ce484222325ull);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  CHECK(fnv1a64("foobar") == 0x85944171f73967e8ull);
}

TEST_CASE("mix64 is SplitMix64's output for the state before the increment", "[data]") {
  // SplitMix64 (Steele, Lea, Flood 2014) seeded with 0: its first two outputs.
  REQUIRE(mix64(0) == 0xE220A8397B1DCDAFull);
  REQUIRE(mix64(0x9E3779B97F4A7C15ull) == 0x6E789E6AA1B965F4ull);
}

TEST_CASE("per-language evaluation sample: n of each language, hashed, independent between languages", "[data]") {
  // Languages 0 and 2 hold the same 20 strings in the same order (as a validation split holds the
  // same held-out English strings in every language), language 1 five, one example an unknown id.
  DataSplit split;
  for (int l : {0, 1, 2})
    for (int j = 0; j < (l == 1 ? 5 : 20); ++j) split.add_example({100 + j, 7}, {0, 1}, l);
  split.add_example({1, 2}, {0, 1}, 9);
  const std::vector<size_t> sample = per_language_sample(split, 3, 8);
  REQUIRE(std::is_sorted(sample.begin(), sample.end()));
  std::map<int32_t, int> seen;  // language -> its examples counted so far
  std::vector<int> position(split.num_examples());
  for (size_t e = 0; e < split.num_examples(); ++e) position[e] = seen[split.lang[e]]++;  // the position within its language
  std::map<int32_t, std::vector<int>> positions;  // language -> the sampled positions within it
  for (size_t e : sample) positions[split.lang[e]].push_back(position[e]);
  REQUIRE(positions[0].size() == 8);
  REQUIRE(positions[1] == std::vector<int>{0, 1, 2, 3, 4});  // a small language: all of it
  REQUIRE(positions[2].size() == 8);
  REQUIRE(positions[9].size() == 1);
  REQUIRE(positions[0] != std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});  // not the first n
  REQUIRE(positions[0] != positions[2]);  // not the same strings in every language
  // The n smallest hashes of (language, position), by brute force.
  for (int l : {0, 2}) {
    std::vector<std::pair<uint64_t, int>> keyed;
    for (int j = 0; j < 20; ++j) keyed.push_back({mix64(uint64_t(l) << 32 | uint64_t(j)), j});
    std::sort(keyed.begin(), keyed.end());
    std::vector<int> want;
    for (int i = 0; i < 8; ++i) want.push_back(keyed[size_t(i)].second);
    std::sort(want.begin(), want.end());
    REQUIRE(positions[l] == want);
  }
  REQUIRE(per_language_sample(split, 3, 8) == sample);  // no hidden state
  REQUIRE(per_language_sample(split, 3, 0).size() == split.num_examples());
  REQUIRE(per_language_sample(split, 3, 20).size() == split.num_examples());
}

TEST_CASE(".mo reader: msgfmt catalogs in both byte orders", "[data]") {
  const std::string dir = fresh_dir("mo");
  const std::multiset<std::pair<std::string, std::string>> want{
      {"Open", "Öffnen"}, {"Close", "Schließen"}, {"File", "File"}, {"Open", "Öffnen"} /* context stripped */,
      {"%d file", "%d Datei"}};
  for (const std::string order : {"little", "big"}) {
    const std::string mo = dir + "/" + order + ".mo";
    msgfmt(kCatalogPo, mo, "--endianness=" + order);
    const std::string bytes = read_bytes(mo);
    REQUIRE(bytes.size() > 28);
    // The magic as the file holds it tells the byte order we asked for.
    CHECK(uint8_t(bytes[0]) == (order == "little" ? 0xde : 0x95));
    const MoCatalog c = read_mo_file(mo);
    INFO(order << ": " << c.error);
    REQUIRE(c.ok());
    CHECK(as_set(c) == want);  // header, fuzzy and untranslated entries absent
  }
}

TEST_CASE(".mo reader: truncated, corrupt and garbage files give errors, never a crash", "[data]") {
  const std::string dir = fresh_dir("mo-bad");
  const std::string mo = dir + "/x.mo";
  msgfmt(kCatalogPo, mo);
  const std::string good = read_bytes(mo);
  REQUIRE(parse_mo(good).ok());
  // Every truncation that cuts more than the final NUL loses part of a string or table.
  for (size_t n = 0; n + 1 < good.size(); ++n) {
    const MoCatalog c = parse_mo(std::string_view(good).substr(0, n));
    INFO("truncated to " << n << " of " << good.size() << " bytes");
    CHECK_FALSE(c.ok());
    CHECK(c.entries.empty());
  }
  CHECK(parse_mo(std::string_view(good).substr(0, good.size() - 1)).ok());

  // Bad magic.
  std::string bad = good;
  bad[0] = 'X';
  CHECK(parse_mo(bad).error.find("magic") != std::string::npos);
  // Unknown major revision.
  bad = good;
  bad[7] = 2;
  CHECK_FALSE(parse_mo(bad).ok());
  // A string offset pointing far past the end (first entry of the original table).
  bad = good;
  const uint32_t orig = uint8_t(good[12]) | uint8_t(good[13]) << 8 | uint8_t(good[14]) << 16 | uint32_t(uint8_t(good[15])) << 24;
  for (int k = 0; k < 4; ++k) bad[orig + 4 + k] = char(0xff);
  CHECK_FALSE(parse_mo(bad).ok());
  // N = 2^32 - 1 with tables that cannot hold it: an error, not a huge allocation.
  bad = good;
  for (int k = 8; k < 12; ++k) bad[size_t(k)] = char(0xff);
  CHECK_FALSE(parse_mo(bad).ok());
  // Random headers and tables after a valid magic: must not crash or read out of bounds (run
  // under ASan/valgrind to see the latter); most are rejected.
  const Rng rng{7, 0, 0, RngPurpose::Test};
  int rejected = 0;
  for (uint64_t trial = 0; trial < 2000; ++trial) {
    std::string g = good;
    const int flips = 1 + int(rng.bits(trial)[0] % 8);
    for (int f = 0; f < flips; ++f) {
      const auto b = rng.bits(trial, uint32_t(f + 1));
      g[4 + b[0] % (g.size() - 4)] = char(b[1]);
    }
    rejected += parse_mo(g).ok() ? 0 : 1;
  }
  CHECK(rejected > 0);
  // A file that does not exist, and one of random bytes: the error names the file.
  CHECK(read_mo_file(dir + "/missing.mo").error.find("missing.mo") != std::string::npos);
  write_text(dir + "/noise.mo", "this is not a catalog at all, just text");
  CHECK(read_mo_file(dir + "/noise.mo").error.find("noise.mo") != std::string::npos);
}

namespace {

// A small locale tree with known content. Expected pairs (translation differs from English,
// non-empty, de-duplicated, example <= 256 tokens):
//   de       (a.mo, b.mo): Open/Öffnen, Close/Schließen, %d file/%d Datei, Open/Aufmachen, Help/Hilfe = 5
//   pt_BR    (a.mo): Open/Abrir, Close/Fechar, Help/Ajuda = 3
//   sr@latin (a.mo, broken.mo skipped): Open/Otvori = 1
//   en       (a.mo): only an identical entry = 0 -> dropped (min_pairs 1)
// FNV-1a 64 % 100: Open 93, Close 63, %d file 78, Help 14 (see the fnv1a64 test). With
// valid_percent = 70: Close and Help are valid, Open and %d file train.
std::string make_locale_tree(const std::string& dir) {
  const std::string root = dir + "/locale";
  msgfmt(std::string(kCatalogPo) + "msgid \"" + std::string(150, 'L') + "\"\nmsgstr \"" + std::string(150, 'M') + "\"\n\n",
         root + "/de/LC_MESSAGES/a.mo");
  msgfmt("msgid \"Open\"\nmsgstr \"Aufmachen\"\n\nmsgid \"Close\"\nmsgstr \"Schließen\"\n\nmsgid \"Help\"\nmsgstr \"Hilfe\"\n\n",
         root + "/de/LC_MESSAGES/b.mo");
  msgfmt("msgid \"Open\"\nmsgstr \"Abrir\"\n\nmsgid \"Close\"\nmsgstr \"Fechar\"\n\nmsgid \"Help\"\nmsgstr \"Ajuda\"\n\n",
         root + "/pt_BR/LC_MESSAGES/a.mo");
  msgfmt("msgid \"Open\"\nmsgstr \"Otvori\"\n\n", root + "/sr@latin/LC_MESSAGES/a.mo");
  write_text(root + "/sr@latin/LC_MESSAGES/broken.mo", std::string("\xde\x12\x04\x95garbage", 11));
  msgfmt("msgid \"Open\"\nmsgstr \"Open\"\n\n", root + "/en/LC_MESSAGES/a.mo");
  write_text(root + "/de/LC_MESSAGES/notes.txt", "not a catalog");
  fs::create_directories(root + "/xx/LC_TIME");
  return root;
}

// The English text of an example: the bytes between SEP and EOS.
std::string english_of(const DataSplit& s, size_t e) {
  std::string out;
  bool after_sep = false;
  for (size_t i = s.example_begin(e); i < s.example_begin(e) + s.example_size(e); ++i) {
    const uint32_t t = s.token(i);
    if (t == uint32_t(Tokenizer::kSep)) after_sep = true;
    else if (after_sep && t < 256) out += char(t);
  }
  return out;
}

}  // namespace

TEST_CASE("prep gettext: exact pairs, split by English text, example layout", "[data]") {
  const std::string dir = fresh_dir("prep");
  const std::string root = make_locale_tree(dir);
  PrepGettextOptions opt;
  opt.root = root;
  opt.valid_percent = 70;
  opt.quiet = true;
  std::ostringstream log;
  const PreparedDataset d = prepare_gettext(opt, log);

  CHECK(log.str().find("broken.mo") != std::string::npos);  // the warning names the skipped file
  CHECK(d.info.languages == std::vector<std::string>{"de", "pt_BR", "sr@latin"});
  CHECK(d.info.vocab_size == 263);
  CHECK(d.info.train_pairs == std::vector<int64_t>{3, 1, 1});
  CHECK(d.info.valid_pairs == std::vector<int64_t>{2, 2, 0});
  CHECK(d.info.sources == std::vector<std::string>{"de/LC_MESSAGES/a.mo", "de/LC_MESSAGES/b.mo",
                                                   "pt_BR/LC_MESSAGES/a.mo", "sr@latin/LC_MESSAGES/a.mo"});
  const PrepStats& st = d.stats;
  CHECK(st.catalogs == 5);
  CHECK(st.catalogs_skipped == 1);
  CHECK(st.entries == 14);  // de 6 + 3, en 1, pt_BR 3, sr@latin 1 = 9 pairs + 2 identical + 2 dup + 1 long
  CHECK(st.identical == 2);
  CHECK(st.duplicates == 2);
  CHECK(st.too_long == 1);
  CHECK(st.languages_dropped == 1);
  CHECK(st.train_examples == 5);
  CHECK(st.valid_examples == 4);

  // The pairs themselves, per split.
  const Tokenizer tok(d.info.languages);
  auto pairs_of = [&](const DataSplit& s) {
    std::multiset<std::string> out;
    for (size_t e = 0; e < s.num_examples(); ++e) {
      std::vector<int32_t> ids;
      for (size_t i = s.example_begin(e); i < s.example_begin(e) + s.example_size(e); ++i) ids.push_back(int32_t(s.token(i)));
      out.insert(tok.decode(ids));
    }
    return out;
  };
  CHECK(pairs_of(d.train) == std::multiset<std::string>{"<de>%d Datei<sep>%d file<eos>", "<de>Aufmachen<sep>Open<eos>",
                                                        "<de>Öffnen<sep>Open<eos>", "<pt_BR>Abrir<sep>Open<eos>",
                                                        "<sr@latin>Otvori<sep>Open<eos>"});
  CHECK(pairs_of(d.valid) == std::multiset<std::string>{"<de>Schließen<sep>Close<eos>", "<de>Hilfe<sep>Help<eos>",
                                                        "<pt_BR>Fechar<sep>Close<eos>", "<pt_BR>Ajuda<sep>Help<eos>"});
  // No English string on both sides; every example on the side its hash says.
  std::set<std::string> train_en, valid_en;
  for (size_t e = 0; e < d.train.num_examples(); ++e) train_en.insert(english_of(d.train, e));
  for (size_t e = 0; e < d.valid.num_examples(); ++e) valid_en.insert(english_of(d.valid, e));
  for (const auto& s : train_en) CHECK((valid_en.count(s) == 0 && fnv1a64(s) % 100 >= 70));
  for (const auto& s : valid_en) CHECK(fnv1a64(s) % 100 < 70);

  // Layout and loss mask of every example: <lang> src SEP eng EOS, mask 1 exactly after SEP.
  for (const DataSplit* s : {&d.train, &d.valid}) {
    for (size_t e = 0; e < s->num_examples(); ++e) {
      const size_t b = s->example_begin(e), n = s->example_size(e);
      CHECK(s->token(b) == uint32_t(Tokenizer::kFirstLang + s->lang[e]));
      CHECK(s->token(b + n - 1) == uint32_t(Tokenizer::kEos));
      size_t sep = 0;
      for (size_t i = b; i < b + n; ++i)
        if (s->token(i) == uint32_t(Tokenizer::kSep)) sep = i;
      REQUIRE(sep > b);
      for (size_t i = b; i < b + n; ++i) CHECK(s->loss_mask[i] == (i > sep ? 1 : 0));
    }
  }

  SECTION("--min-pairs drops small languages from the vocabulary") {
    PrepGettextOptions o2 = opt;
    o2.min_pairs = 2;
    const PreparedDataset d2 = prepare_gettext(o2, log);
    CHECK(d2.info.languages == std::vector<std::string>{"de", "pt_BR"});
    CHECK(d2.info.vocab_size == 262);
    CHECK(d2.stats.languages_dropped == 2);
  }
  SECTION("--languages filters; an unknown language is an input error") {
    PrepGettextOptions o2 = opt;
    o2.languages = {"pt_BR"};
    const PreparedDataset d2 = prepare_gettext(o2, log);
    CHECK(d2.info.languages == std::vector<std::string>{"pt_BR"});
    CHECK(d2.info.train_pairs == std::vector<int64_t>{1});
    o2.languages = {"pt_BR", "klingon"};
    CHECK_THROWS_WITH(prepare_gettext(o2, log), Catch::Contains("klingon"));
  }
  SECTION("--max-len caps examples") {
    PrepGettextOptions o2 = opt;
    o2.max_len = 16;  // <de>Schließen<sep>Close<eos> is 1+10+1+5+1 = 18 tokens: dropped
    const PreparedDataset d2 = prepare_gettext(o2, log);
    for (const DataSplit* s : {&d2.train, &d2.valid})
      for (size_t e = 0; e < s->num_examples(); ++e) CHECK(s->example_size(e) <= 16);
    CHECK(d2.stats.too_long > 1);
  }
  SECTION("bad options are input errors") {
    PrepGettextOptions o2 = opt;
    o2.root = dir + "/nowhere";
    CHECK_THROWS_WITH(prepare_gettext(o2, log), Catch::Contains("nowhere"));
    o2 = opt;
    o2.valid_percent = 101;
    CHECK_THROWS_AS(prepare_gettext(o2, log), InputError);
    o2 = opt;
    o2.min_pairs = 100;
    CHECK_THROWS_AS(prepare_gettext(o2, log), InputError);
  }
}

TEST_CASE("dataset file: prep gettext writes, Dataset::open reads back the same", "[data]") {
  const std::string dir = fresh_dir("file");
  PrepGettextOptions opt;
  opt.root = make_locale_tree(dir);
  opt.valid_percent = 70;
  opt.quiet = true;
  opt.output = dir + "/g.h5";
  std::ostringstream log;
  const PreparedDataset d = prepare_gettext(opt, log);
  REQUIRE(prep_gettext_main(opt) == 0);  // rank 0 writes; the other ranks (if any) only wait
  if (test::world_rank() != 0) write_dataset(opt.output, d.info, d.train, d.valid);  // their own dir
  for (const std::string split : {"train", "valid"}) {
    const Dataset ds = Dataset::open(opt.output, split);
    const DataSplit& want = split == "train" ? d.train : d.valid;
    CHECK(ds.info().languages == d.info.languages);
    CHECK(ds.info().train_pairs == d.info.train_pairs);
    CHECK(ds.info().valid_pairs == d.info.valid_pairs);
    CHECK(ds.info().sources == d.info.sources);
    CHECK(ds.info().created_by == "meshmoe prep gettext");
    CHECK(ds.vocab_size() == 263);
    CHECK_FALSE(ds.split().wide);
    CHECK(ds.split().tokens16 == want.tokens16);
    CHECK(ds.split().doc_offsets == want.doc_offsets);
    CHECK(ds.split().lang == want.lang);
    CHECK(ds.split().loss_mask == want.loss_mask);
  }
  // The bytes the memory plan counts, from the datasets' shapes alone, against the vectors that
  // Dataset::open fills (EXACT).
  const DatasetInfo info = Dataset::read_info(opt.output);
  for (const std::string split : {"train", "valid"}) {
    const Dataset opened = Dataset::open(opt.output, split);
    const DataSplit& s = opened.split();
    const size_t held = s.tokens16.size() * 2 + s.tokens32.size() * 4 + s.loss_mask.size() +
                        s.doc_offsets.size() * sizeof(int64_t) + s.lang.size() * sizeof(int32_t);
    CHECK(size_t(split == "train" ? info.train_bytes : info.valid_bytes) == held);
    if (split == "train") CHECK(size_t(info.train_examples) == s.num_examples());
  }
  CHECK(info.train_bytes > 0);
  CHECK_THROWS_WITH(Dataset::open(opt.output, "test"), Catch::Contains("unknown split"));
  CHECK_THROWS_WITH(Dataset::open(dir + "/none.h5", "train"), Catch::Contains("none.h5"));
  write_text(dir + "/text.h5", "plain text, not HDF5");
  CHECK_THROWS_WITH(Dataset::open(dir + "/text.h5", "train"), Catch::Contains("text.h5"));
  {
    h5::File f = h5::File::create(dir + "/other.h5");
    f.write("train/tokens", std::vector<uint16_t>{1, 2, 3});
  }
  CHECK_THROWS_WITH(Dataset::open(dir + "/other.h5", "train"), Catch::Contains("/train/doc_offsets"));
  // A token outside the vocabulary is caught.
  {
    DataSplit bad = d.train;
    bad.tokens16[3] = 300;
    DatasetInfo info = d.info;
    write_dataset(dir + "/bad.h5", info, bad, d.valid);
  }
  CHECK_THROWS_WITH(Dataset::open(dir + "/bad.h5", "train"), Catch::Contains("outside the vocabulary"));
  CHECK_THROWS_AS(prep_gettext_main(PrepGettextOptions{}), InputError);  // no -o
}

TEST_CASE("dataset file: loss_mask values other than 0/1 and a train split without targets are refused", "[data]") {
  const std::string dir = fresh_dir("mask");
  write_text(dir + "/a.txt", "first line\nsecond line\nthird line\nfourth line\n");
  PrepTextOptions opt;
  opt.files = {dir + "/a.txt"};
  opt.valid_percent = 0;
  opt.quiet = true;
  std::ostringstream log;
  const PreparedDataset d = prepare_text(opt, log);
  REQUIRE(d.train.num_tokens() > 5);
  {
    DataSplit bad = d.train;
    bad.loss_mask[5] = 7;
    write_dataset(dir + "/seven.h5", d.info, bad, d.valid);
  }
  CHECK_THROWS_WITH(Dataset::open(dir + "/seven.h5", "train"),
                    Catch::Contains("seven.h5 (split /train): loss_mask[5] = 7 is neither 0 nor 1"));
  {
    DataSplit none = d.train;
    std::fill(none.loss_mask.begin(), none.loss_mask.end(), uint8_t(0));
    write_dataset(dir + "/zero.h5", d.info, none, none);
  }
  CHECK_THROWS_WITH(Dataset::open(dir + "/zero.h5", "train"),
                    Catch::Contains("no target token (loss_mask = 1) in " + dir + "/zero.h5 /train: nothing to train on"));
  CHECK(Dataset::open(dir + "/zero.h5", "valid").num_examples() == d.train.num_examples());  // valid: no loss is allowed
}

TEST_CASE("prep: the output is never one of the inputs; empty splits are reported", "[data]") {
  const std::string dir = fresh_dir("same");
  const std::string text = "first line\nsecond line\nthird line\n";
  write_text(dir + "/a.txt", text);
  fs::create_directories(dir + "/x");
  fs::create_symlink(dir + "/a.txt", dir + "/link.h5");
  PrepTextOptions opt;
  opt.files = {dir + "/a.txt"};
  opt.quiet = true;
  std::ostringstream log;
  for (const std::string& out : {dir + "/a.txt", dir + "/x/../a.txt", dir + "/./a.txt", dir + "/link.h5"}) {
    INFO(out);
    opt.output = out;
    CHECK_THROWS_WITH(prepare_text(opt, log), Catch::Contains("refusing to overwrite it"));
    CHECK_THROWS_AS(prep_text_main(opt), InputError);
    CHECK(read_bytes(dir + "/a.txt") == text);
  }
  opt.output = dir + "/a.h5";
  opt.valid_percent = 0;
  CHECK_NOTHROW(prepare_text(opt, log));
  CHECK(log.str().find("prep text: warning: the valid split is empty (--valid-percent 0): a deck must set eval.every = 0") !=
        std::string::npos);
  opt.valid_percent = 100;
  CHECK_THROWS_WITH(prepare_text(opt, log), Catch::Contains("the train split is empty (--valid-percent 100)"));

  PrepGettextOptions g;
  g.root = make_locale_tree(dir + "/g");
  g.quiet = true;
  g.output = g.root + "/de/LC_MESSAGES/../LC_MESSAGES/a.mo";
  const std::string mo = read_bytes(g.root + "/de/LC_MESSAGES/a.mo");
  REQUIRE(!mo.empty());
  CHECK_THROWS_WITH(prepare_gettext(g, log), Catch::Contains("refusing to overwrite it"));
  CHECK(read_bytes(g.root + "/de/LC_MESSAGES/a.mo") == mo);
}

TEST_CASE("prep text: lines, paragraphs, long lines cut on UTF-8 boundaries", "[data]") {
  const std::string dir = fresh_dir("text");
  const std::string long_line = std::string(10, 'a') + "ü" + std::string(10, 'b');  // 22 bytes
  write_text(dir + "/a.txt", "first line\r\n\n  \nsecond line\n" + long_line + "\n");
  PrepTextOptions opt;
  opt.files = {dir + "/a.txt"};
  opt.max_len = 13;  // pieces of at most 11 bytes
  opt.valid_percent = 0;
  opt.quiet = true;
  std::ostringstream log;
  const PreparedDataset d = prepare_text(opt, log);
  CHECK(d.info.languages == std::vector<std::string>{"text"});
  CHECK(d.info.vocab_size == 261);
  CHECK(d.valid.num_examples() == 0);
  const Tokenizer tok(d.info.languages);
  std::vector<std::string> got;
  for (size_t e = 0; e < d.train.num_examples(); ++e) {
    std::vector<int32_t> ids;
    const size_t b = d.train.example_begin(e), n = d.train.example_size(e);
    for (size_t i = b; i < b + n; ++i) {
      ids.push_back(int32_t(d.train.token(i)));
      CHECK(d.train.loss_mask[i] == (i == b ? 0 : 1));
    }
    CHECK(n <= 13);
    got.push_back(tok.decode(ids));
  }
  // "first line" (10 bytes) fits; "second line" (11) fits; the 22-byte line is cut at 10 (not
  // inside the 2-byte "ü" at bytes 10..11), then 11, then 1.
  CHECK(got == std::vector<std::string>{"<text>first line<eos>", "<text>second line<eos>", "<text>aaaaaaaaaa<eos>",
                                        "<text>übbbbbbbbb<eos>", "<text>b<eos>"});
  opt.paragraphs = true;
  opt.max_len = 256;
  const PreparedDataset p = prepare_text(opt, log);
  CHECK(p.train.num_examples() == 2);  // "first line" | "second line\n<long>"
  opt.files.push_back(dir + "/missing.txt");
  CHECK_THROWS_WITH(prepare_text(opt, log), Catch::Contains("missing.txt"));
}

namespace {

// Examples whose tokens name them: example i = [260 + i % 2, 'a' + i % 26 (len - 2 times), EOS].
Dataset toy_dataset(const std::vector<int>& lengths) {
  DatasetInfo info;
  info.languages = {"de", "fr"};
  info.vocab_size = 262;
  DataSplit s;
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<int32_t> ids{int32_t(260 + i % 2)};
    for (int k = 0; k + 2 < lengths[i]; ++k) ids.push_back('a' + int32_t(i % 26));
    ids.push_back(Tokenizer::kEos);
    std::vector<uint8_t> mask(ids.size(), 1);
    mask[0] = 0;
    s.add_example(ids, mask, int32_t(i % 2));
  }
  info.train_pairs = {int64_t(lengths.size()), 0};
  info.valid_pairs = {0, 0};
  return Dataset::from_memory(info, s);
}

bool same(const Batch& a, const Batch& b) {
  return a.rows == b.rows && a.seq_len == b.seq_len && a.inputs == b.inputs && a.targets == b.targets &&
         a.lang == b.lang && a.mask == b.mask && a.segment == b.segment && a.position == b.position;
}

}  // namespace

TEST_CASE("batcher: packing, padding, dropping and shifted targets (hand-computed)", "[data]") {
  // A = [260 a a EOS] (4), B = [261 b b b b EOS] (6), C = 12 tokens, D = [261 d EOS] (3); seq_len 8
  // -> rows of 9 tokens. Every token after the tag is a target, so C (12 > 9) cannot lose a source
  // to fit: it is dropped.
  const Dataset ds = toy_dataset({4, 6, 12, 3});
  CHECK(count_too_long(ds.split(), 8).dropped == 1);
  CHECK(count_too_long(ds.split(), 8).truncated == 0);
  Batcher b(ds, 8, 1, false);
  const Batch x = b.next(4);
  const int32_t P = Tokenizer::kPad, E = Tokenizer::kEos;
  // row 0: A B? 4 + 6 = 10 > 9, so A then PAD x5. row 1: B, C dropped, D: 6 + 3 = 9.
  // row 2 (epoch 1) and row 3 the same again.
  const std::vector<int32_t> row_a{260, 'a', 'a', E, P, P, P, P, P}, row_bd{261, 'b', 'b', 'b', 'b', E, 261, 'd', E};
  const std::vector<std::vector<int32_t>> rows = {row_a, row_bd, row_a, row_bd};
  const std::vector<int32_t> lang_a{0, 0, 0, 0, -1, -1, -1, -1, -1}, lang_bd(9, 1);
  const std::vector<std::vector<int32_t>> langs = {lang_a, lang_bd, lang_a, lang_bd};
  // Segment (example within the row, the PAD tail one more) and position of each token.
  const std::vector<int32_t> seg_a{0, 0, 0, 0, 1, 1, 1, 1, 1}, seg_bd{0, 0, 0, 0, 0, 0, 1, 1, 1};
  const std::vector<int32_t> pos_a{0, 1, 2, 3, 0, 1, 2, 3, 4}, pos_bd{0, 1, 2, 3, 4, 5, 0, 1, 2};
  const std::vector<std::vector<int32_t>> segs = {seg_a, seg_bd, seg_a, seg_bd}, pos = {pos_a, pos_bd, pos_a, pos_bd};
  REQUIRE(x.rows == 4);
  REQUIRE(x.seq_len == 8);
  for (int r = 0; r < 4; ++r) {
    for (int j = 0; j < 8; ++j) {
      INFO("row " << r << " col " << j);
      const size_t k = size_t(r * 8 + j);
      CHECK(x.inputs[k] == rows[size_t(r)][size_t(j)]);
      CHECK(x.targets[k] == rows[size_t(r)][size_t(j + 1)]);
      CHECK(x.lang[k] == langs[size_t(r)][size_t(j + 1)]);
      CHECK(x.segment[k] == segs[size_t(r)][size_t(j)]);
      CHECK(x.position[k] == pos[size_t(r)][size_t(j)]);
      // The mask follows the target: 0 on PAD and on a language tag, 1 on text and EOS.
      const int32_t t = rows[size_t(r)][size_t(j + 1)];
      CHECK(x.mask[k] == ((t == P || t >= 260) ? 0.0f : 1.0f));
    }
  }
  CHECK(b.cursor() == DataCursor{1, 4});
}

TEST_CASE("batcher: a too-long example loses the end of its source, never its target", "[data]") {
  // Translation-like examples [tag s.. SEP t.. EOS], loss on t.. and EOS; seq_len 8 (rows of 9).
  //   X: tag s1..s6 SEP t1 t2 EOS (11): keeps tag s1..s4, cuts s5 s6, keeps SEP t1 t2 EOS
  //   Y: tag s1 SEP t1..t7 EOS (11): SEP + target = 9, with the tag 10 > 9: dropped
  //   Z: tag s1 SEP t1 EOS (5): fits
  const int32_t S = Tokenizer::kSep, E = Tokenizer::kEos;
  DatasetInfo info;
  info.languages = {"de"};
  info.vocab_size = 261;
  DataSplit s;
  s.add_example({260, 1, 2, 3, 4, 5, 6, S, 11, 12, E}, {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1}, 0);
  s.add_example({260, 1, S, 11, 12, 13, 14, 15, 16, 17, E}, {0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}, 0);
  s.add_example({260, 1, S, 11, E}, {0, 0, 0, 1, 1}, 0);
  info.train_pairs = {3};
  info.valid_pairs = {0};
  const Dataset ds = Dataset::from_memory(info, s);
  const TooLong t = count_too_long(ds.split(), 8);
  CHECK(t.truncated == 1);
  CHECK(t.dropped == 1);
  Batcher b(ds, 8, 1, false);
  const Batch x = b.next(2);
  // row 0: X kept as 9 tokens; row 1: Y dropped, Z, PAD x4.
  CHECK(x.inputs == std::vector<int32_t>{260, 1, 2, 3, 4, S, 11, 12, /**/ 260, 1, S, 11, E, 256, 256, 256});
  CHECK(x.targets == std::vector<int32_t>{1, 2, 3, 4, S, 11, 12, E, /**/ 1, S, 11, E, 256, 256, 256, 256});
  // X's three targets and Z's two all count.
  CHECK(x.mask == std::vector<float>{0, 0, 0, 0, 0, 1, 1, 1, /**/ 0, 0, 1, 1, 0, 0, 0, 0});
  CHECK(x.position == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, /**/ 0, 1, 2, 3, 4, 0, 1, 2});
  CHECK(b.cursor() == DataCursor{1, 0});  // row 1 went on into epoch 1, where X no longer fits
  // Only dropped examples: refused at the start (else the batcher would loop for ever).
  DataSplit only_long;
  only_long.add_example({260, 1, S, 11, 12, 13, 14, 15, 16, 17, E}, {0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}, 0);
  info.train_pairs = {1};
  const Dataset all_dropped = Dataset::from_memory(info, only_long);
  CHECK_THROWS_WITH(Batcher(all_dropped, 8, 1, false), Catch::Contains("raise model.seq_len"));
}

TEST_CASE("batcher: a target in the next example never counts, even when its data mask says so", "[data]") {
  // Two examples whose every token is a target (mask 1, the first included): rows of 8 + 1 tokens
  // hold [5 6 7] [8 9 10 11] PAD PAD. Input 7 (example 0) is followed by 8 (example 1): masked.
  DatasetInfo info;
  info.languages = {"de"};
  info.vocab_size = 261;
  DataSplit s;
  s.add_example({5, 6, 7}, {1, 1, 1}, 0);
  s.add_example({8, 9, 10, 11}, {1, 1, 1, 1}, 0);
  info.train_pairs = {2};
  info.valid_pairs = {0};
  const Dataset ds = Dataset::from_memory(info, s);
  const Batch x = Batcher(ds, 8, 1, false).next(1);
  CHECK(x.mask == std::vector<float>{1, 1, 0, 1, 1, 1, 0, 0});
  CHECK(x.segment == std::vector<int32_t>{0, 0, 0, 1, 1, 1, 1, 2});
  CHECK(x.position == std::vector<int32_t>{0, 1, 2, 0, 1, 2, 3, 0});
}

TEST_CASE("batcher encdec: split at SEP, both sides packed with matching segments (hand-computed)", "[data]") {
  // seq_len 6 on each side. Examples [tag s.. SEP t.. EOS], loss on t.. and EOS:
  //   A: 260 1 2 SEP 11 12 EOS     encoder 260 1 2 (3)        decoder BOS 11 12 -> 11 12 EOS (3)
  //   B: 260 3 SEP 13 EOS          encoder 260 3 (2)          decoder BOS 13 -> 13 EOS (2)
  //   C: 260 4..10 SEP 14 EOS      source 8 > 6: encoder 260 4..8 (6, cut 9 10), decoder 2
  //   D: 260 5 SEP 21..26 EOS      target 7 > 6: dropped
  //   F: 260 SEP 15 EOS ... tag only as its source: encoder 260 (1), decoder 2
  // Row 0: A + B (encoder 5, decoder 5); C does not fit beside them. Row 1: C alone (encoder full).
  // Row 2: D dropped, F, then epoch 1: A (encoder 1 + 3, decoder 2 + 3), B does not fit.
  const int32_t S = Tokenizer::kSep, E = Tokenizer::kEos, P = Tokenizer::kPad, G = Tokenizer::kBos;
  DatasetInfo info;
  info.languages = {"de"};
  info.vocab_size = 261;
  DataSplit s;
  s.add_example({260, 1, 2, S, 11, 12, E}, {0, 0, 0, 0, 1, 1, 1}, 0);
  s.add_example({260, 3, S, 13, E}, {0, 0, 0, 1, 1}, 0);
  s.add_example({260, 4, 5, 6, 7, 8, 9, 10, S, 14, E}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1}, 0);
  s.add_example({260, 5, S, 21, 22, 23, 24, 25, 26, E}, {0, 0, 0, 1, 1, 1, 1, 1, 1, 1}, 0);
  s.add_example({260, S, 15, E}, {0, 0, 1, 1}, 0);
  info.train_pairs = {5};
  info.valid_pairs = {0};
  const Dataset ds = Dataset::from_memory(info, s);
  const TooLong t = count_too_long(ds.split(), 6, ModelArch::EncDec);
  CHECK(t.truncated == 1);
  CHECK(t.dropped == 1);
  CHECK(fit_encdec_example(ds.split(), 2, 6, S).cut == 2);
  Batcher b(ds, 6, 1, false, 1.0, ModelArch::EncDec);
  const Batch x = b.next(3);
  REQUIRE(x.enc_len == 6);
  REQUIRE(x.seq_len == 6);
  CHECK(x.enc_inputs == std::vector<int32_t>{260, 1, 2, 260, 3, P, /**/ 260, 4, 5, 6, 7, 8, /**/ 260, 260, 1, 2, P, P});
  CHECK(x.enc_segment == std::vector<int32_t>{0, 0, 0, 1, 1, 2, /**/ 0, 0, 0, 0, 0, 0, /**/ 0, 1, 1, 1, 2, 2});
  CHECK(x.enc_position == std::vector<int32_t>{0, 1, 2, 0, 1, 0, /**/ 0, 1, 2, 3, 4, 5, /**/ 0, 0, 1, 2, 0, 1});
  CHECK(x.inputs == std::vector<int32_t>{G, 11, 12, G, 13, P, /**/ G, 14, P, P, P, P, /**/ G, 15, G, 11, 12, P});
  CHECK(x.targets == std::vector<int32_t>{11, 12, E, 13, E, P, /**/ 14, E, P, P, P, P, /**/ 15, E, 11, 12, E, P});
  CHECK(x.mask == std::vector<float>{1, 1, 1, 1, 1, 0, /**/ 1, 1, 0, 0, 0, 0, /**/ 1, 1, 1, 1, 1, 0});
  CHECK(x.segment == std::vector<int32_t>{0, 0, 0, 1, 1, 2, /**/ 0, 0, 1, 1, 1, 1, /**/ 0, 0, 1, 1, 1, 2});
  CHECK(x.position == std::vector<int32_t>{0, 1, 2, 0, 1, 0, /**/ 0, 1, 0, 1, 2, 3, /**/ 0, 1, 0, 1, 2, 0});
  CHECK(x.lang == std::vector<int32_t>{0, 0, 0, 0, 0, -1, /**/ 0, 0, -1, -1, -1, -1, /**/ 0, 0, 0, 0, 0, -1});
  CHECK(b.cursor() == DataCursor{1, 1});
  // A rank's slice holds its rows of both sides.
  const Batch r1 = x.slice(1, 2);
  CHECK(r1.enc_inputs == std::vector<int32_t>{260, 4, 5, 6, 7, 8});
  CHECK(r1.inputs == std::vector<int32_t>{G, 14, P, P, P, P});
  // The decoder-only batcher is untouched by the arch of the same data: no encoder fields.
  CHECK(Batcher(ds, 12, 1, false).next(1).enc_len == 0);
  // Examples without SEP (prep text) cannot be split: refused, named.
  DataSplit text;
  text.add_example({260, 1, 2, E}, {0, 1, 1, 1}, 0);
  info.train_pairs = {1};
  const Dataset no_sep = Dataset::from_memory(info, text);
  CHECK_THROWS_WITH(Batcher(no_sep, 6, 1, false, 1.0, ModelArch::EncDec), Catch::Contains("has no SEP"));
}

TEST_CASE("batcher: seeded order, cursor restore, rank slices", "[data]") {
  std::vector<int> lengths;
  const Rng rng{3, 0, 0, RngPurpose::Test};
  for (int i = 0; i < 200; ++i) lengths.push_back(3 + int(rng.bits(uint64_t(i))[0] % 30));
  const Dataset ds = toy_dataset(lengths);

  SECTION("every epoch visits a permutation; seeds and epochs differ; no shuffle = file order") {
    Batcher b(ds, 16, 42, true);
    const auto o0 = b.epoch_order(0), o1 = b.epoch_order(1);
    auto sorted = o0;
    std::sort(sorted.begin(), sorted.end());
    for (uint32_t i = 0; i < sorted.size(); ++i) CHECK(sorted[i] == i);
    CHECK(o0 != o1);
    CHECK(Batcher(ds, 16, 43, true).epoch_order(0) != o0);
    CHECK(Batcher(ds, 16, 42, true).epoch_order(0) == o0);
    const auto plain = Batcher(ds, 16, 42, false).epoch_order(5);
    for (uint32_t i = 0; i < plain.size(); ++i) CHECK(plain[i] == i);
  }
  SECTION("the stream of examples is the epoch order, none lost except by truncation") {
    // seq_len 40 > longest example: nothing is truncated, so the example starts (tag tokens) in
    // the stream, read row after row, follow the epoch order exactly.
    Batcher b(ds, 40, 9, true);
    std::vector<uint32_t> want = b.epoch_order(0);
    const auto more = b.epoch_order(1);
    want.insert(want.end(), more.begin(), more.end());
    std::vector<int32_t> letters;  // the letter of each example = index % 26
    while (letters.size() < 250) {
      const Batch x = b.next(4);
      for (int r = 0; r < x.rows; ++r) {
        // Token stream of the row: inputs then the last target.
        std::vector<int32_t> row(x.inputs.begin() + r * 40, x.inputs.begin() + (r + 1) * 40);
        row.push_back(x.targets[size_t(r * 40 + 39)]);
        for (size_t j = 0; j + 1 < row.size(); ++j)
          if (row[j] >= 260) letters.push_back(row[j + 1]);
      }
    }
    for (size_t i = 0; i < 250; ++i) {
      INFO("example " << i << " of the stream");
      const uint32_t e = want[i];
      CHECK(letters[i] == (lengths[e] > 2 ? int32_t('a' + e % 26) : int32_t(Tokenizer::kEos)));
    }
  }
  SECTION("cursor save/restore gives the identical next batch") {
    Batcher a(ds, 16, 5, true);
    for (int s = 0; s < 30; ++s) a.next(8);  // several epochs in
    const DataCursor c = a.cursor();
    CHECK(c.epoch > 0);
    const Batch want = a.next(8);
    Batcher fresh(ds, 16, 5, true);
    fresh.restore(c);
    CHECK(same(fresh.next(8), want));
    CHECK(fresh.cursor() == a.cursor());
    a.restore(c);
    CHECK(same(a.next(8), want));
    CHECK_THROWS_AS(a.restore(DataCursor{0, 201}), InputError);
  }
  SECTION("the union of rank slices is the global batch, and every rank's cursor agrees") {
    Batcher global(ds, 16, 11, true);
    for (int s = 0; s < 3; ++s) global.next(12);
    const DataCursor c = global.cursor();
    const Batch want = global.next(12);
    for (int parts : {1, 2, 3, 4}) {
      Batch joined;
      joined.seq_len = 16;
      for (int p = 0; p < parts; ++p) {
        const auto [off, cnt] = test::even_split(12, parts, p);
        Batcher r(ds, 16, 11, true);
        r.restore(c);
        const Batch part = r.next(12, int(off), int(off + cnt));
        CHECK(r.cursor() == global.cursor());
        CHECK(same(part, want.slice(int(off), int(off + cnt))));
        joined.rows += part.rows;
        joined.inputs.insert(joined.inputs.end(), part.inputs.begin(), part.inputs.end());
        joined.targets.insert(joined.targets.end(), part.targets.begin(), part.targets.end());
        joined.lang.insert(joined.lang.end(), part.lang.begin(), part.lang.end());
        joined.mask.insert(joined.mask.end(), part.mask.begin(), part.mask.end());
        joined.segment.insert(joined.segment.end(), part.segment.begin(), part.segment.end());
        joined.position.insert(joined.position.end(), part.position.begin(), part.position.end());
      }
      INFO(parts << " parts");
      CHECK(same(joined, want));
    }
  }
  SECTION("bad arguments") {
    CHECK_THROWS_AS(Batcher(ds, 0, 1, true), InputError);
    DatasetInfo info;
    info.languages = {"de"};
    info.vocab_size = 261;
    const Dataset empty = Dataset::from_memory(info, DataSplit{});
    CHECK_THROWS_AS(Batcher(empty, 8, 1, true), InputError);
  }
}

TEST_CASE("batcher: language-balanced sampling over a skewed dataset (data.temperature)", "[data]") {
  // Languages of 800, 200 and 50 examples (6 tokens, the language's letter), and 5 of language 0
  // whose target cannot fit a sequence of 8 + 1 tokens (dropped: never drawn, not counted in n_l).
  const std::vector<size_t> n_l{800, 200, 50};
  DatasetInfo info;
  info.languages = {"aa", "bb", "cc"};
  info.vocab_size = 263;
  DataSplit s;
  for (size_t l = 0; l < n_l.size(); ++l)
    for (size_t i = 0; i < n_l[l]; ++i)
      s.add_example({int32_t(260 + l), int32_t('a' + l), 1, 2, 3, Tokenizer::kEos}, {0, 0, 1, 1, 1, 1}, int32_t(l));
  for (int i = 0; i < 5; ++i)
    s.add_example({260, 'x', 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, Tokenizer::kEos}, {0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 0);
  info.train_pairs = {805, 200, 50};
  info.valid_pairs = {0, 0, 0};
  const Dataset ds = Dataset::from_memory(info, s);
  const double n = 1050;

  SECTION("p_l = (n_l / n)^(1/T), normalised; T = 1 is proportional") {
    for (double T : {1.0, 5.0, 100.0, 0.5}) {
      Batcher b(ds, 8, 7, true, T);
      double z = 0;
      for (size_t l : n_l) z += std::pow(double(l) / n, 1.0 / T);
      for (size_t l = 0; l < 3; ++l) CHECK(b.language_probabilities()[l] == Approx(std::pow(double(n_l[l]) / n, 1.0 / T) / z).epsilon(1e-12));
    }
    CHECK(Batcher(ds, 8, 7, true, 1.0).language_probabilities()[2] == Approx(50.0 / 1050).epsilon(1e-12));
  }
  SECTION("the draws follow p_l within 5 binomial standard deviations; dropped examples never come") {
    for (double T : {5.0, 100.0}) {
      Batcher b(ds, 8, 7, true, T);
      std::vector<double> count(3, 0);
      double draws = 0;
      for (uint64_t epoch = 0; epoch < 20; ++epoch) {
        const auto order = b.epoch_order(epoch);
        CHECK(order.size() == ds.num_examples());
        for (uint32_t e : order) {
          REQUIRE(e < 1050);  // the five dropped examples are 1050..1054
          count[size_t(s.lang[e])] += 1;
          draws += 1;
        }
      }
      for (size_t l = 0; l < 3; ++l) {
        const double p = b.language_probabilities()[l];
        INFO("T = " << T << ", language " << l << ": " << count[l] << " of " << draws << " draws, p = " << p);
        CHECK(std::abs(count[l] / draws - p) <= 5 * std::sqrt(p * (1 - p) / draws));
      }
    }
  }
  SECTION("a pure function of (seed, epoch); an upsampled language cycles through its epoch's permutation") {
    Batcher a(ds, 8, 7, true, 5.0), b(ds, 8, 7, true, 5.0);
    CHECK(a.epoch_order(3) == b.epoch_order(3));
    CHECK(a.epoch_order(3) != a.epoch_order(4));
    CHECK(Batcher(ds, 8, 8, true, 5.0).epoch_order(3) != a.epoch_order(3));
    std::vector<uint32_t> cc;
    for (uint32_t e : a.epoch_order(3))
      if (s.lang[e] == 2) cc.push_back(e);
    REQUIRE(cc.size() > 100);  // p = 0.14 of 1055 draws: upsampled from 50
    std::vector<uint32_t> first(cc.begin(), cc.begin() + 50);
    std::sort(first.begin(), first.end());
    for (uint32_t i = 0; i < 50; ++i) CHECK(first[i] == 1000 + i);
    for (size_t i = 50; i < cc.size(); ++i) CHECK(cc[i] == cc[i - 50]);
  }
  SECTION("a restored cursor continues the same stream") {
    Batcher a(ds, 8, 7, true, 5.0);
    for (int step = 0; step < 300; ++step) a.next(4);  // past an epoch
    const DataCursor c = a.cursor();
    CHECK(c.epoch > 0);
    const Batch want = a.next(4);
    Batcher fresh(ds, 8, 7, true, 5.0);
    fresh.restore(c);
    CHECK(same(fresh.next(4), want));
  }
  SECTION("bad arguments") {
    CHECK_THROWS_WITH(Batcher(ds, 8, 7, false, 5.0), Catch::Contains("shuffled order"));
    CHECK_THROWS_AS(Batcher(ds, 8, 7, true, 0.0), InputError);
  }
}

// Every reader of a dataset file (its attributes, each split, the tokenizer it names) answers each
// structural change of a valid file (tests/support/h5_mutate.hpp) with its result or a clean
// InputError naming the file: never a crash, never another exception (docs/ARCHITECTURE.md
// "Principles" item 6). The fixed set of mutations of tests/fuzz/h5_readers_fuzz.cpp.
TEST_CASE("dataset file: every structural mutation of a valid file is read or refused cleanly", "[data]") {
  const std::string dir = fresh_dir("mutations");
  write_text(dir + "/a.txt", "first line\nsecond line\nthird line\nfourth line\n");
  PrepTextOptions opt;
  opt.files = {dir + "/a.txt"};
  opt.valid_percent = 50;
  opt.quiet = true;
  std::ostringstream log;
  const PreparedDataset d = prepare_text(opt, log);
  const std::string good = dir + "/good.h5", path = dir + "/mutated.h5";
  write_dataset(good, d.info, d.train, d.valid);
  REQUIRE(Dataset::open(good, "train").num_examples() > 0);
  int mutated = 0, refused = 0;
  for (const test::H5Site& site : test::h5_sites(good))
    for (int k = 0; k < int(test::H5Mutation::kCount); ++k) {
      const auto m = test::H5Mutation(k);
      std::filesystem::copy_file(good, path, std::filesystem::copy_options::overwrite_existing);
      INFO(site.object << (site.attribute.empty() ? "" : " attribute " + site.attribute) << ": " << test::h5_mutation_name(m));
      if (!test::h5_mutate(path, site, m)) continue;
      ++mutated;
      bool refused_here = false;
      const auto read = [&](const std::function<void()>& f) {
        try {
          f();
        } catch (const InputError& e) {
          refused_here = true;
          CHECK_THAT(std::string(e.what()), Catch::Contains(path));
        }
      };
      read([&] { Dataset::read_info(path).tokenizer_object(); });
      read([&] { Dataset::open(path, "train"); });
      read([&] { Dataset::open(path, "valid").info().tokenizer_object(); });
      refused += refused_here;
    }
  CHECK(mutated > 200);
  CHECK(refused > mutated / 3);
}

TEST_CASE("dataset file: a vocabulary over 65535 stores uint32 tokens", "[data]") {
  const std::string dir = fresh_dir("wide");
  DatasetInfo info;
  for (int i = 0; i < 65280; ++i) info.languages.push_back("l" + std::to_string(100000 + i));  // sorted
  info.vocab_size = 260 + 65280;  // 65540
  info.train_pairs.assign(info.languages.size(), 0);
  info.valid_pairs.assign(info.languages.size(), 0);
  DataSplit train, valid;
  train.wide = valid.wide = true;
  train.add_example({65539, 'x', Tokenizer::kSep, 'y', Tokenizer::kEos}, {0, 0, 0, 1, 1}, 65279);
  write_dataset(dir + "/w.h5", info, train, valid);
  const Dataset ds = Dataset::open(dir + "/w.h5", "train");
  REQUIRE(ds.split().wide);
  CHECK(ds.split().tokens32 == std::vector<uint32_t>{65539, 'x', 259, 'y', 258});
  CHECK(ds.split().lang == std::vector<int32_t>{65279});
  h5::File f = h5::File::open(dir + "/w.h5");
  CHECK(f.dataset("train/tokens").type_size() == 4);
  CHECK(f.dataset("valid/tokens").size() == 0);
}

TEST_CASE("SentencePiece tokenizer: pieces after the tags, round trip, byte fallback, deterministic", "[data]") {
  // A corpus of 120 made-up words of two or three syllables (some with accents) in 600 lines; 320
  // pieces: 256 byte-fallback pieces, the characters, and what the words give.
  const char* syllables[] = {"ka", "ro", "mi", "te", "su", "\u00f6f", "fen", "da", "\u00eat", "lo", "ne", "pi"};
  std::vector<std::string> vocab;
  for (int i = 0; i < 120; ++i)
    vocab.push_back(std::string(syllables[i % 12]) + syllables[(i / 12 + i) % 12] + (i % 3 ? syllables[(i * 5) % 12] : ""));
  std::vector<std::string> lines;
  for (int i = 0; i < 600; ++i)
    lines.push_back(vocab[size_t(i * 7 % 120)] + " " + vocab[size_t(i * 13 % 120)] + " " + vocab[size_t(i % 120)]);
  const std::vector<std::string_view> texts(lines.begin(), lines.end());
  const std::string model = Tokenizer::train_spm(texts, 320, nullptr);
  CHECK(Tokenizer::train_spm(texts, 320, nullptr) == model);  // the same texts give the same model

  const Tokenizer tok({"fr", "de"}, model);
  REQUIRE(tok.is_spm());
  CHECK(std::string(tok.name()) == Tokenizer::kSpmName);
  CHECK(tok.spm_pieces() == 320);
  CHECK(tok.first_piece() == Tokenizer::kFirstLang + 2);
  CHECK(tok.vocab_size() == Tokenizer::kFirstLang + 2 + 320);
  for (const std::string& s : {vocab[3] + " " + vocab[50], vocab[7] + vocab[8], std::string("unseen \u4e2d\u6587 text!"),
                              std::string("  two  spaces")}) {
    const std::vector<int32_t> ids = tok.encode(s);
    REQUIRE_FALSE(ids.empty());
    for (const int32_t id : ids) {
      CHECK(id >= tok.first_piece());
      CHECK(id < tok.vocab_size());
    }
    // SentencePiece normalises runs of spaces (NFKC + whitespace folding): compare with that form.
    std::string folded;
    for (const char c : s)
      if (c != ' ' || (!folded.empty() && folded.back() != ' ')) folded += c;
    if (!folded.empty() && folded.back() == ' ') folded.pop_back();
    CHECK(tok.decode(ids) == folded);
  }
  // Learnt words take fewer pieces than bytes.
  const std::string known = vocab[10] + " " + vocab[20] + " " + vocab[30];
  CHECK(tok.encode(known).size() < known.size());
  // Specials and tags around pieces decode as in the byte tokenizer.
  std::vector<int32_t> ids{tok.lang_token("de")};
  tok.encode(vocab[1], ids);
  ids.push_back(Tokenizer::kSep);
  tok.encode(vocab[2], ids);
  ids.push_back(Tokenizer::kEos);
  CHECK(tok.decode(ids) == "<de>" + vocab[1] + "<sep>" + vocab[2] + "<eos>");
  CHECK_THROWS_AS(tok.token_text(tok.vocab_size()), Error);
  CHECK_THROWS_AS(Tokenizer({"de"}, "not a model"), InputError);
}

TEST_CASE("SentencePiece training sample: a fixed uniform subset in the texts' order", "[data]") {
  std::vector<std::string> lines;
  for (int i = 0; i < 1000; ++i) lines.push_back("text " + std::to_string(i * 7919 % 1000));
  const std::vector<std::string_view> texts(lines.begin(), lines.end());
  CHECK(spm_training_sample(texts, 0) == texts);
  CHECK(spm_training_sample(texts, 1000) == texts);
  CHECK(spm_training_sample(texts, 5000) == texts);
  const std::vector<std::string_view> sample = spm_training_sample(texts, 300);
  REQUIRE(sample.size() == 300);
  // The oracle: the 300 texts of the smallest mix64(fnv1a64(text)), by a full sort.
  std::vector<std::pair<uint64_t, std::string_view>> keyed;
  for (const auto t : texts) keyed.emplace_back(mix64(fnv1a64(t)), t);
  std::sort(keyed.begin(), keyed.end());
  std::set<std::string_view> want;
  for (size_t i = 0; i < 300; ++i) want.insert(keyed[i].second);
  CHECK(std::set<std::string_view>(sample.begin(), sample.end()) == want);
  // In the order of `texts`: a subsequence of it.
  size_t at = 0;
  for (const auto s : sample) {
    while (at < texts.size() && texts[at] != s) ++at;
    CHECK(at < texts.size());
    ++at;
  }
  // The same set from the texts in another order.
  std::vector<std::string_view> reversed(texts.rbegin(), texts.rend());
  const std::vector<std::string_view> sample_r = spm_training_sample(reversed, 300);
  CHECK(std::set<std::string_view>(sample_r.begin(), sample_r.end()) == want);
  // A uniform sample: each tenth of the texts (by value) holds its share, 30 +- 15 (a binomial's
  // standard deviation is ~5: a 3-sigma bound).
  std::map<int, int> per_tenth;
  for (const auto s : sample) ++per_tenth[std::stoi(std::string(s.substr(5))) / 100];
  for (int d = 0; d < 10; ++d) CHECK(std::abs(per_tenth[d] - 30) <= 15);
  CHECK_THROWS_AS(parse_tokenizer_options("prep gettext", "spm", 300, 99), InputError);
  CHECK_THROWS_AS(parse_tokenizer_options("prep gettext", "spm", 300, -1), InputError);
  CHECK(parse_tokenizer_options("prep gettext", "spm", 300, 0) == TokenizerKind::Spm);
  CHECK(parse_tokenizer_options("prep gettext", "spm", 300, 100) == TokenizerKind::Spm);
}

TEST_CASE("SentencePiece: encode_all on any number of threads, the trainer's phases as progress lines", "[data]") {
  std::vector<std::string> lines;
  const char* words[] = {"open", "close", "fichier", "\u00f6ffnen", "\u958b\u304f", "speichern", "drucken", "view"};
  for (int i = 0; i < 400; ++i)
    lines.push_back(std::string(words[i % 8]) + " " + words[(i / 8) % 8] + " " + words[(i * 3) % 8] + " " +
                    std::to_string(i % 37));
  const std::vector<std::string_view> texts(lines.begin(), lines.end());
  std::ostringstream progress;
  const std::string model = Tokenizer::train_spm(texts, 290, &progress);
  CHECK(Tokenizer::train_spm(texts, 290, nullptr) == model);  // the progress lines change nothing
  const std::string p = progress.str();
  for (const char* phase : {"Loaded all 400 sentences", "Alphabet size=", "Making suffix array", "EM sub_iter="})
    CHECK(p.find(phase) != std::string::npos);
  CHECK(p.find("trainer_spec") == std::string::npos);     // the options dump is dropped,
  CHECK(p.find("Starts training") == std::string::npos);  // and the lines of no phase
  CHECK(p.find("  spm ") == 0);

  const Tokenizer tok({"de"}, model);
  std::vector<std::string_view> some(texts.begin(), texts.begin() + 50);
  some.push_back("");  // an empty text has no ids
  for (const int threads : {1, 3, 7, 64}) {
    const Tokenizer::EncodedTexts e = tok.encode_all(some, threads);
    REQUIRE(e.offsets.size() == some.size() + 1);
    CHECK(e.offsets.back() == e.ids.size());
    for (size_t i = 0; i < some.size(); ++i)
      CHECK(std::vector<int32_t>(e.ids.begin() + std::ptrdiff_t(e.offsets[i]), e.ids.begin() + std::ptrdiff_t(e.offsets[i + 1])) ==
            tok.encode(some[i]));
  }
  CHECK(tok.encode_all({}, 4).offsets == std::vector<size_t>{0});
}
