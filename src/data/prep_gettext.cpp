#include <algorithm>
#include <chrono>
#include <filesystem>
#include <ostream>
#include <span>
#include <unordered_set>

#include "core/error.hpp"
#include "data/mo_file.hpp"
#include "data/prep.hpp"
#include "tensor/host_threads.hpp"

namespace meshmoe {
namespace fs = std::filesystem;

namespace {

struct Catalog {
  std::string language, path, relative;  // relative to root: "de/LC_MESSAGES/apt.mo"
};

// <root>/<lang>/LC_MESSAGES/*.mo, sorted by language then file name.
std::vector<Catalog> scan_catalogs(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    throw InputError("prep gettext: --root " + root + " is not a directory (a locale tree like /usr/share/locale)");
  std::vector<Catalog> out;
  for (const auto& lang_dir : fs::directory_iterator(root, fs::directory_options::skip_permission_denied, ec)) {
    const std::string lang = lang_dir.path().filename().string();
    const fs::path msgs = lang_dir.path() / "LC_MESSAGES";
    std::error_code ec2;
    if (!fs::is_directory(msgs, ec2)) continue;
    for (const auto& f : fs::directory_iterator(msgs, fs::directory_options::skip_permission_denied, ec2)) {
      std::error_code ec3;
      if (f.path().extension() != ".mo" || !fs::is_regular_file(f.path(), ec3)) continue;
      out.push_back(Catalog{lang, f.path().string(), lang + "/LC_MESSAGES/" + f.path().filename().string()});
    }
  }
  if (ec) throw InputError("prep gettext: cannot list " + root + ": " + ec.message());
  std::sort(out.begin(), out.end(), [](const Catalog& a, const Catalog& b) { return a.relative < b.relative; });
  return out;
}

// The pairs of one language, kept as bytes until the vocabulary (set of languages) is known.
struct LanguagePairs {
  std::string name;
  std::string bytes;  // translation then English, pair after pair
  struct Pair {
    uint64_t offset;
    uint32_t src_len, eng_len;
  };
  std::vector<Pair> pairs;
  std::vector<std::string> sources;
};

}  // namespace

PreparedDataset prepare_gettext(const PrepGettextOptions& opt, std::ostream& log) {
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.max_len < 4) throw InputError("prep gettext: --max-len must be >= 4 (got " + std::to_string(opt.max_len) + ")");
  if (opt.valid_percent < 0 || opt.valid_percent > 100)
    throw InputError("prep gettext: --valid-percent must be in 0..100 (got " + std::to_string(opt.valid_percent) + ")");
  if (opt.min_pairs < 0) throw InputError("prep gettext: --min-pairs must be >= 0");
  const TokenizerKind tokenizer = parse_tokenizer_options("prep gettext", opt.tokenizer, opt.spm_pieces, opt.spm_sample);
  if (opt.threads < 0 || opt.threads > 1024)
    throw InputError("prep gettext: --threads must be in 0..1024 (got " + std::to_string(opt.threads) + ")");
  if (opt.direction != "xx-en" && opt.direction != "en-xx")
    throw InputError("prep gettext: --direction must be xx-en (translation to English) or en-xx (English to the "
                     "translation) (got " + opt.direction + ")");
  const bool from_english = opt.direction == "en-xx";
  const bool bytes_tokens = tokenizer == TokenizerKind::Bytes;

  std::vector<Catalog> catalogs = scan_catalogs(opt.root);
  {
    std::vector<std::string> inputs;
    for (const auto& c : catalogs) inputs.push_back(c.path);
    refuse_output_overwriting_input("prep gettext", opt.output, inputs);
  }
  if (!opt.languages.empty()) {
    std::vector<std::string> unknown;
    for (const auto& l : opt.languages)
      if (std::none_of(catalogs.begin(), catalogs.end(), [&](const Catalog& c) { return c.language == l; }))
        unknown.push_back(l);
    if (!unknown.empty()) {
      std::string u;
      for (const auto& x : unknown) u += (u.empty() ? "" : ", ") + x;
      throw InputError("prep gettext: --languages names languages without catalogs under " + opt.root + ": " + u);
    }
    std::erase_if(catalogs, [&](const Catalog& c) {
      return std::find(opt.languages.begin(), opt.languages.end(), c.language) == opt.languages.end();
    });
  }
  if (catalogs.empty())
    throw InputError("prep gettext: no catalogs <lang>/LC_MESSAGES/*.mo under " + opt.root);

  PreparedDataset out;
  PrepStats& st = out.stats;
  std::vector<LanguagePairs> langs;
  std::unordered_set<std::string> seen;  // (msgid, msgstr) of the current language
  // Catalogs are sorted by language, so one language's catalogs are consecutive.
  for (size_t ci = 0; ci < catalogs.size(); ++ci) {
    const Catalog& c = catalogs[ci];
    if (langs.empty() || langs.back().name != c.language) {
      langs.push_back(LanguagePairs{c.language, {}, {}, {}});
      seen.clear();
    }
    LanguagePairs& lp = langs.back();
    const MoCatalog mo = read_mo_file(c.path);
    if (!mo.ok()) {
      log << "prep gettext: warning: skipping " << mo.error << "\n";
      ++st.catalogs_skipped;
      continue;
    }
    ++st.catalogs;
    lp.sources.push_back(c.relative);
    for (const MoEntry& e : mo.entries) {
      ++st.entries;
      if (e.msgstr.empty()) { ++st.untranslated; continue; }
      if (e.msgstr == e.msgid) { ++st.identical; continue; }
      // <lang> source SEP target EOS, one side the translation, the other English
      // (pieces are counted once the pairs are encoded)
      if (bytes_tokens && int64_t(e.msgstr.size() + e.msgid.size() + 3) > opt.max_len) { ++st.too_long; continue; }
      if (!seen.insert(e.msgid + '\0' + e.msgstr).second) { ++st.duplicates; continue; }
      lp.pairs.push_back({lp.bytes.size(), uint32_t(e.msgstr.size()), uint32_t(e.msgid.size())});
      lp.bytes += e.msgstr;
      lp.bytes += e.msgid;
    }
    if (!opt.quiet && (ci + 1) % 500 == 0) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      log << "prep gettext: " << ci + 1 << "/" << catalogs.size() << " catalogs, language " << c.language << ", "
          << s << " s\n" << std::flush;
    }
  }

  // Languages with too few pairs leave the vocabulary.
  std::vector<std::string> kept;
  for (const auto& lp : langs) {
    if (int64_t(lp.pairs.size()) >= opt.min_pairs) {
      kept.push_back(lp.name);
    } else {
      ++st.languages_dropped;
      st.pairs_dropped_with_languages += int64_t(lp.pairs.size());
    }
  }
  if (kept.empty())
    throw InputError("prep gettext: no language under " + opt.root + " has at least " + std::to_string(opt.min_pairs) +
                     " translated pairs (lower --min-pairs or raise --max-len)");

  std::vector<std::string_view> train_texts;
  if (!bytes_tokens) {
    std::unordered_set<std::string_view> english;
    for (const auto& lp : langs) {
      if (std::find(kept.begin(), kept.end(), lp.name) == kept.end()) continue;
      for (const auto& p : lp.pairs) {
        const std::string_view src(lp.bytes.data() + p.offset, p.src_len), eng(src.data() + p.src_len, p.eng_len);
        if (in_valid_split(eng, opt.valid_percent)) continue;
        train_texts.push_back(src);
        if (english.insert(eng).second) train_texts.push_back(eng);
      }
    }
  }
  const Tokenizer tok =
      prep_tokenizer("prep gettext", tokenizer, opt.spm_pieces, opt.spm_sample, kept, train_texts, opt.quiet, log);
  DatasetInfo& info = out.info;
  info.tokenizer = tok.name();
  info.spm_model = tok.spm_model();
  info.vocab_size = tok.vocab_size();
  info.languages = tok.languages();
  info.train_pairs.assign(kept.size(), 0);
  info.valid_pairs.assign(kept.size(), 0);
  info.created_by = "meshmoe prep gettext";
  info.root = opt.root;
  info.direction = opt.direction;
  out.train.wide = out.valid.wide = info.vocab_size > 65535;

  // xx-en: <lang> translation SEP English EOS; en-xx: <lang> English SEP translation EOS, the tag
  // then naming the language to translate into. Both sides of every kept pair are encoded at once on
  // --threads threads, then laid out in order.
  std::vector<std::string_view> sides;  // source then target, pair after pair
  for (const auto& lp : langs) {
    if (tok.language_index(lp.name) < 0) continue;
    for (const auto& p : lp.pairs) {
      const std::string_view src(lp.bytes.data() + p.offset, p.src_len);
      const std::string_view eng(lp.bytes.data() + p.offset + p.src_len, p.eng_len);
      sides.push_back(from_english ? eng : src);
      sides.push_back(from_english ? src : eng);
    }
  }
  const int threads = requested_run_threads(opt.threads);
  const auto t_encode = std::chrono::steady_clock::now();
  const Tokenizer::EncodedTexts encoded = tok.encode_all(sides, threads);
  if (!opt.quiet && !bytes_tokens) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_encode).count();
    size_t bytes = 0;
    for (const auto& t : sides) bytes += t.size();
    log << "prep gettext: encoded " << sides.size() << " texts (" << bytes / 1000000.0 << " MB) into "
        << encoded.ids.size() << " pieces on " << threads << " thread" << (threads > 1 ? "s" : "") << " in " << s
        << " s (" << bytes / 1000000.0 / std::max(s, 1e-9) << " MB/s)\n" << std::flush;
  }
  auto side = [&](size_t i) {
    return std::span<const int32_t>(encoded.ids.data() + encoded.offsets[i], encoded.offsets[i + 1] - encoded.offsets[i]);
  };

  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  size_t next_side = 0;
  for (const auto& lp : langs) {
    const int li = tok.language_index(lp.name);
    if (li < 0) continue;
    info.sources.insert(info.sources.end(), lp.sources.begin(), lp.sources.end());
    for (const auto& p : lp.pairs) {
      const std::string_view eng(lp.bytes.data() + p.offset + p.src_len, p.eng_len);
      const auto source = side(next_side++), target = side(next_side++);
      ids.clear();
      ids.push_back(Tokenizer::kFirstLang + li);
      ids.insert(ids.end(), source.begin(), source.end());
      ids.push_back(Tokenizer::kSep);
      const size_t first_target = ids.size();
      ids.insert(ids.end(), target.begin(), target.end());
      ids.push_back(Tokenizer::kEos);
      if (int64_t(ids.size()) > opt.max_len) {
        ++st.too_long;
        continue;
      }
      // Loss on what the model predicts after SEP: the target side's tokens and EOS.
      mask.assign(ids.size(), 0);
      std::fill(mask.begin() + std::ptrdiff_t(first_target), mask.end(), uint8_t(1));
      const bool valid = in_valid_split(eng, opt.valid_percent);
      (valid ? out.valid : out.train).add_example(ids, mask, li);
      ++(valid ? info.valid_pairs : info.train_pairs)[size_t(li)];
    }
  }
  st.train_examples = int64_t(out.train.num_examples());
  st.valid_examples = int64_t(out.valid.num_examples());
  st.train_tokens = int64_t(out.train.num_tokens());
  st.valid_tokens = int64_t(out.valid.num_tokens());
  check_split_sizes("prep gettext", out, opt.valid_percent, log);
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace meshmoe
