// twell: command-line tool. `twell --help` lists the subcommands.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "commands.h"
#include "core/atomic_file.h"
#include "twell/cpu/threads.h"
#include "twell/version.h"

namespace {

// Whether what was printed reached its file (stdout_failure); says so where not.
bool stdout_written() {
  const std::string why = twell::cli::stdout_failure();
  if (!why.empty()) std::fprintf(stderr, "twell: error: %s\n", why.c_str());
  return why.empty();
}

// Edit distance (insertions, deletions, substitutions and swaps of neighbours), for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The first of the arguments CLI11 did not take that looks like an option, or "" (its own message
// lists them last first: "The following arguments were not expected: cpu --backnd").
std::string unknown_option(const CLI::App& app) {
  for (const std::string& arg : app.remaining(true)) {
    if (arg.size() < 2 || arg[0] != '-' || (arg[1] >= '0' && arg[1] <= '9') || arg[1] == '.') continue;
    return arg.substr(0, arg.find('='));
  }
  return {};
}

// "did you mean --backend?" for the one long option of `app` the name begins (an abbreviation:
// --temp), else the nearest within an edit for every three letters of the name (at least one), or "".
std::string nearest_option(const CLI::App& app, const std::string& name) {
  std::vector<std::string> longer;
  for (const CLI::Option* o : app.get_options())
    for (const std::string& l : o->get_lnames())
      if (name.size() > 3 && ("--" + l).compare(0, name.size(), name) == 0) longer.push_back("--" + l);
  if (longer.size() == 1) return longer.front();
  std::string best;
  const size_t letters = name.size() - std::min<size_t>(name.find_first_not_of('-'), name.size());
  size_t best_d = std::max<size_t>(1, letters / 3) + 1;
  for (const CLI::Option* o : app.get_options())
    for (const std::string& l : o->get_lnames()) {
      const size_t d = edit_distance(name, "--" + l);
      if (d < best_d) best_d = d, best = "--" + l;
    }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  twell::io::detail::remove_temporaries_on_signals();  // a Ctrl-C mid-save leaves no temporary behind
  CLI::App app{"twell: sparse-activation transformer FFNs (TwELL format and kernels)", "twell"};
  app.set_version_flag("--version", TWELL_VERSION_STRING);
  app.require_subcommand(1);
  std::string command_line = "twell";
  for (int i = 1; i < argc; ++i) command_line += std::string(" ") + argv[i];
  twell::cli::register_bench(app, command_line);
  twell::cli::register_inspect(app);
  twell::cli::register_run(app);
  twell::cli::register_eval(app);
  // CLI11 reads an empty value of a number option (`-d ""`, `-d 0.1 ""`) as 0: refused instead,
  // repeated or after '=', before the option's own checks (transform() goes first). (An empty piece
  // of a list, `-d 0.1,,0.2`, CLI11 drops: no value is read as 0 there.)
  const std::function<void(CLI::App*)> refuse_empty_numbers = [&](CLI::App* a) {
    for (CLI::Option* o : a->get_options()) {
      const std::string type = o->get_type_name();
      if (type.find("INT") != std::string::npos || type.find("FLOAT") != std::string::npos)
        o->transform(CLI::Validator(
            [](std::string& value) { return value.empty() ? std::string(twell::cli::kEmptyNumber) : ""; },
            ""));
    }
    for (CLI::App* sub : a->get_subcommands({})) refuse_empty_numbers(sub);
  };
  refuse_empty_numbers(&app);
  // CLI11 would say "A subcommand is required" for a misspelt one (`twell bnech`, `twell bench ffm`).
  CLI::App* level = &app;
  std::string path = "twell";
  const auto command_names = [&] {  // of `level`, for the messages
    std::string names;
    for (const CLI::App* s : level->get_subcommands({})) names += (names.empty() ? "" : ", ") + s->get_name();
    return names;
  };
  for (int i = 1; i < argc && argv[i][0] != '-' && !level->get_subcommands({}).empty(); ++i) {
    CLI::App* sub = nullptr;
    try {
      sub = level->get_subcommand(argv[i]);
    } catch (const CLI::OptionNotFound&) {
    }
    if (!sub) {
      std::fprintf(stderr, "%s: unknown command '%s' (commands: %s; see %s --help)\n", path.c_str(), argv[i],
                   command_names().c_str(), path.c_str());
      return 1;
    }
    level = sub;
    path += std::string(" ") + argv[i];
  }
  // The option an argument names, with its value attached or not (--name, --name=VALUE, -X, -XVALUE).
  const auto option_named = [&](const std::string& arg) -> const CLI::Option* {
    if (arg.size() < 2 || arg[0] != '-' || arg == "--") return nullptr;
    const bool long_form = arg.compare(0, 2, "--") == 0;
    const std::string name = long_form ? arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos
                                                                                          : arg.find('=') - 2)
                                       : arg.substr(1, 1);
    for (const CLI::Option* o : level->get_options())
      if (long_form ? o->check_lname(name) : o->check_sname(name)) return o;
    return nullptr;
  };
  // What CLI11 would read wrongly, refused instead:
  // - `--prompt=` (nothing after the '=') it reads as `--prompt` and takes the next argument as its
  //   value, so that `--prompt= --no-stop` would generate from the text "--no-stop";
  // - an option that takes a value gets the next argument even when that is another option
  //   (`-p --no-stop`, `--json --sparsity` writing a file of that name), unless written with '='
  //   (`--prompt=--no-stop`).
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    const CLI::Option* o = option_named(arg);
    if (o == nullptr) continue;
    const bool long_form = arg.compare(0, 2, "--") == 0;
    if (long_form && arg.size() >= 4 && arg.back() == '=') {
      const std::string name = arg.substr(2, arg.size() - 3);
      if (o->get_expected_min() == 0)
        std::fprintf(stderr, "%s: --%s is a flag and takes no value; see %s --help\n", path.c_str(), name.c_str(),
                     path.c_str());
      else
        std::fprintf(stderr,
                     "%s: %s has nothing after the '='; give a value (--%s=VALUE or --%s VALUE); see %s --help\n",
                     path.c_str(), arg.c_str(), name.c_str(), name.c_str(), path.c_str());
      return 1;
    }
    // A list with an empty item (`-M 4,,8`, `--distribution uniform,`): CLI11 drops the item silently.
    if (o->get_delimiter() == ',') {
      const size_t eq = arg.find('=');
      const std::string value = long_form && eq != std::string::npos ? arg.substr(eq + 1)
                                : !long_form && arg.size() > 2     ? arg.substr(2)
                                : i + 1 < argc                     ? std::string(argv[i + 1])
                                                                   : std::string();
      if (value.find(",,") != std::string::npos || (!value.empty() && (value.front() == ',' || value.back() == ','))) {
        std::fprintf(stderr, "%s: %s: the list '%s' has an empty item; see %s --help\n", path.c_str(),
                     arg.substr(0, long_form ? eq : 2).c_str(), value.c_str(), path.c_str());
        return 1;
      }
    }
    if (o->get_expected_min() == 0 || i + 1 >= argc) continue;
    if ((long_form && arg.find('=') != std::string::npos) || (!long_form && arg.size() > 2))
      continue;  // its value is attached (--name=VALUE, -XVALUE)
    const std::string next_arg = argv[i + 1];
    // Text with a space in it is a value however it begins (a prompt "-n dashes here").
    if ((option_named(next_arg) == nullptr || next_arg.find_first_of(" \t\n") != std::string::npos) &&
        next_arg != "--") {
      ++i;  // its value, whatever it looks like
      continue;
    }
    const std::string hint = o->get_lnames().empty() ? std::string()
                             : " (a value that starts with '-': --" + o->get_lnames().front() + "=" + argv[i + 1] + ")";
    std::fprintf(stderr, "%s: %s needs a value, got %s %s%s; see %s --help\n", path.c_str(), argv[i],
                 next_arg == "--" ? "the separator" : "the option", argv[i + 1], hint.c_str(), path.c_str());
    return 1;
  }
  try {
    // A bad TWELL_NUM_THREADS said before a command loads anything (--help and --version, which
    // parse() answers by throwing, go first).
    app.parse_complete_callback([] { twell::cpu::num_threads(); });
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e) == 0 && stdout_written() ? 0 : 1;  // --help, --version
    // Every command-line error in one form, "twell run: <what>; see twell run --help", exit status
    // 1 as for any other error. An unknown option is named first (CLI11 may report something else
    // about it, e.g. "A subcommand is required" for `twell --bogus`), with the nearest real one.
    const std::string bad = unknown_option(app);
    if (!bad.empty()) {
      const std::string near = nearest_option(*level, bad);
      const std::string hint = near.empty() ? "" : " (did you mean " + near + "?)";
      std::fprintf(stderr, "%s: unknown option '%s'%s; see %s --help\n", path.c_str(), bad.c_str(), hint.c_str(),
                   path.c_str());
      return 1;
    }
    std::string what = e.what();
    while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
    // CLI11's own phrasings, in ours.
    if (what == "A subcommand is required") what = "a command is required: " + command_names();
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {  // in their order, with a hint for prompts
      const std::vector<std::string> extras = app.remaining(true);
      std::string words;
      bool word = false;  // one that is not a number: the rest of a prompt, perhaps
      for (const std::string& arg : extras) {
        words += (words.empty() ? "" : " ") + arg;
        word = word || arg.find_first_not_of("0123456789.-+eE") != std::string::npos;
      }
      what = std::string("unexpected argument") + (extras.size() == 1 ? "" : "s") + " '" + words + "'";
      // The hint where the extra words follow a -p (given as -p, --prompt, --prompt=..., -pWORD): "twell run
      // M M -p hi" is a repeated model, not a prompt out of quotes.
      const CLI::Option* prompt = level->get_option_no_throw("--prompt");
      int prompt_at = -1;
      for (int i = 1; prompt != nullptr && i < argc && std::string(argv[i]) != "--"; ++i)
        if (option_named(argv[i]) == prompt) prompt_at = i;
      bool after_prompt = false;
      for (int i = prompt_at + 1; prompt_at >= 0 && i < argc && !extras.empty(); ++i)
        after_prompt = after_prompt || extras.front() == argv[i];
      if (word && after_prompt)
        what += " (a prompt of several words goes in quotes: -p \"...\")";
    }
    const size_t at_most = what.find(": At Most 1 required but received ");
    if (at_most != std::string::npos) what = what.substr(0, at_most) + " is given more than once";
    // "--json: 1 required TEXT:FILE missing": the option came last, with no value.
    const size_t required = what.find(": 1 required ");
    if (required != std::string::npos && what.size() > 8 && what.compare(what.size() - 8, 8, " missing") == 0)
      what = what.substr(0, required) + " needs a value";
    // "Could not convert: --density = 0.005,out.json": an option of several values takes every word
    // after it, up to the next option; a word meant for another option went with them.
    const std::string convert = "Could not convert: ";
    if (what.compare(0, convert.size(), convert) == 0 && what.find(" = ") != std::string::npos) {
      const size_t eq = what.find(" = ");
      const std::string name = what.substr(convert.size(), eq - convert.size());
      std::string values = what.substr(eq + 3);
      const bool several = values.find(',') != std::string::npos;  // CLI11 joins the words it took
      std::replace(values.begin(), values.end(), ',', ' ');
      what = name + ": cannot read '" + values + "'" +
             (several ? " as its values (it takes every word after it, up to the next option)" : " as a number");
    }
    std::fprintf(stderr, "%s: %s; see %s --help\n", path.c_str(), what.c_str(), path.c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "twell: error: out of host memory (std::bad_alloc)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "twell: error: %s\n", e.what());
    return 1;
  }
  return stdout_written() ? 0 : 1;
}
