//! The documentation, run as written: every code block of README.md and docs/ that a user
//! would paste.
//!
//! - `sh` blocks run through `bash` with the built binary first on `PATH`, in a scratch
//!   folder that holds the repository's `docs/`; the blocks of one page run in order in
//!   one shell, as a reader pastes them one after another. What a command prints is
//!   checked against the `# …` lines written right under it (`…` stands for any text).
//!   A block that cannot run here says why on the line before it
//!   (`<!-- docs-test: not run: REASON -->`); its `inhook` commands are still parsed by
//!   the real command line, and the scripts and files it names must exist.
//! - `toml` blocks load through the real config loader; an excerpt (a block with a
//!   `# …` line) must use only keys and types the loader knows.
//! - `json` blocks are JSON.
//! - Every relative link of every page leads to a file, and its `#anchor` to a heading.
//!
//! As written means on the default address, `127.0.0.1:8080`: the tests that serve need
//! that port free, and take turns on it.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use clap::Parser;

/// The tests that serve on 127.0.0.1:8080 take turns.
static DEFAULT_PORT: Mutex<()> = Mutex::new(());

/// The note that keeps a block from running: `<!-- docs-test: not run: REASON -->`.
const NOT_RUN: &str = "not run:";
/// The note on the README's quick start, which its own test runs as two shells.
const QUICK_START: &str = "the quick start";

fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every page under docs/, as paths relative to the repository.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "md") {
                found.push(path.strip_prefix(repository()).unwrap().to_path_buf());
            }
        }
    }
    let mut found = vec![PathBuf::from("README.md")];
    walk(&repository().join("docs"), &mut found);
    found
}

fn read(page: &Path) -> String {
    std::fs::read_to_string(repository().join(page)).unwrap()
}

/// A fenced code block of a page.
#[derive(Debug)]
struct Block {
    page: PathBuf,
    /// The line of its opening fence, from 1.
    line: usize,
    lang: String,
    /// Its lines, the fence's indentation taken off.
    text: String,
    /// The `<!-- docs-test: … -->` note on the line before it.
    note: Option<String>,
}

impl Block {
    fn at(&self) -> String {
        format!("{}:{}", self.page.display(), self.line)
    }

    fn not_run(&self) -> Option<&str> {
        self.note.as_deref().and_then(|n| n.strip_prefix(NOT_RUN))
    }
}

fn blocks(page: &Path) -> Vec<Block> {
    let text = read(page);
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        let Some(lang) = trimmed.strip_prefix("```").filter(|l| !l.is_empty()) else {
            i += 1;
            continue;
        };
        let indent = lines[i].len() - trimmed.len();
        let note = i
            .checked_sub(1)
            .map(|before| lines[before].trim())
            .and_then(|l| l.strip_prefix("<!-- docs-test:"))
            .and_then(|l| l.strip_suffix("-->"))
            .map(|l| l.trim().to_owned());
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && lines[i].trim() != "```" {
            body.push(lines[i].get(indent..).unwrap_or(lines[i].trim_start()));
            i += 1;
        }
        found.push(Block {
            page: page.to_path_buf(),
            line: start + 1,
            lang: lang.trim().to_owned(),
            text: body.join("\n"),
            note,
        });
        i += 1;
    }
    found
}

fn all_blocks(lang: &str) -> Vec<Block> {
    pages()
        .iter()
        .flat_map(|p| blocks(p))
        .filter(|b| b.lang == lang)
        .collect()
}

/// One shell command of a block (its continuation lines joined) and the output shown under it.
#[derive(Debug, Clone)]
struct Step {
    command: String,
    shown: Vec<String>,
}

/// The commands of an `sh` block. A `# ` line right under a command is what it prints; any
/// other `#` line is a comment. Heredoc bodies belong to their command.
fn steps(text: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut lines = text.lines();
    let mut after_command = false;
    while let Some(line) = lines.next() {
        if line.trim().is_empty() {
            after_command = false;
            continue;
        }
        if let Some(comment) = line.trim_start().strip_prefix('#') {
            if after_command {
                let shown = comment.strip_prefix(' ').unwrap_or(comment);
                steps.last_mut().unwrap().shown.push(shown.to_owned());
            }
            continue;
        }
        let mut command = line.to_owned();
        while command.ends_with('\\') {
            command.push('\n');
            command.push_str(lines.next().expect("a continued line"));
        }
        if let Some(tag) = heredoc_tag(&command) {
            for body in lines.by_ref() {
                command.push('\n');
                command.push_str(body);
                if body.trim() == tag {
                    break;
                }
            }
        }
        steps.push(Step {
            command,
            shown: Vec::new(),
        });
        after_command = true;
    }
    steps
}

fn heredoc_tag(command: &str) -> Option<String> {
    let after = &command[command.find("<<")? + 2..];
    let tag = after.trim_start_matches('-').trim_start();
    let tag: String = tag
        .chars()
        .filter(|c| *c != '\'' && *c != '"')
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!tag.is_empty()).then_some(tag)
}

/// Whether `printed` is the `shown` line, `…` matching any text.
fn matches(shown: &str, printed: &str) -> bool {
    let parts: Vec<&str> = shown.split('…').collect();
    let mut rest = printed;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            let Some(after) = rest.strip_prefix(part) else {
                return false;
            };
            rest = after;
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            let Some(at) = rest.find(part) else {
                return false;
            };
            rest = &rest[at + part.len()..];
        }
    }
    rest.is_empty()
}

/// The words of one simple command, as the shell splits them (quotes removed, `$…`
/// expansions left as written), up to the first operator (`|`, `&`, `;`, `>`, `<`).
fn words(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = command.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    word.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        q => word.push(q),
                    }
                }
            }
            '\\' => match chars.next() {
                Some('\n') | None => {}
                Some(escaped) => {
                    in_word = true;
                    word.push(escaped);
                }
            },
            '#' if !in_word => break,
            '|' | '&' | ';' | '>' | '<' => break,
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The command's words without its leading `export` and `NAME=value` assignments.
fn program(command: &str) -> Vec<String> {
    let mut words = words(command);
    if words.first().is_some_and(|w| w == "export") {
        return Vec::new();
    }
    let assignments = words
        .iter()
        .take_while(|w| {
            w.split_once('=').is_some_and(|(name, _)| {
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
        })
        .count();
    words.drain(..assignments);
    words
}

/// What can be checked of a command without running it: an `inhook` command is one the
/// command line takes; the scripts and the repository's files it names exist.
fn check_statically(block: &Block, step: &Step) -> Result<(), String> {
    let words = program(&step.command);
    let Some(first) = words.first() else {
        return Ok(());
    };
    if first == "inhook" {
        if let Err(e) = inhook_server::cli::Cli::try_parse_from(&words) {
            use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
            if !matches!(e.kind(), DisplayHelp | DisplayVersion) {
                return Err(format!(
                    "{}: {:?} is not a command inhook takes: {e}",
                    block.at(),
                    step.command
                ));
            }
        }
    }
    if first.starts_with("scripts/") || first.starts_with("tests/") {
        let path = repository().join(first);
        let executable = std::fs::metadata(&path)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0)
            .unwrap_or(false);
        if !executable {
            return Err(format!(
                "{}: {first} is not an executable file of the repository",
                block.at()
            ));
        }
    }
    for word in &words {
        let path = word.split_once('=').map_or(word.as_str(), |(_, v)| v);
        if (path.starts_with("docs/") || path.starts_with("tests/") || path.starts_with("scripts/"))
            && !path.contains('$')
            && !repository().join(path).exists()
        {
            return Err(format!("{}: {path} is not in the repository", block.at()));
        }
    }
    Ok(())
}

fn bash(dir: &Path, command: &str) -> Command {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_inhook")).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    let mut bash = Command::new("bash");
    bash.arg("-c")
        .arg(command)
        .current_dir(dir)
        .env("PATH", path);
    for (name, _) in std::env::vars().filter(|(n, _)| n.starts_with("INHOOK_")) {
        bash.env_remove(name);
    }
    bash
}

/// A scratch folder holding the repository's `docs/`, as a clone's root does.
fn scratch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(repository().join("docs"), dir.path().join("docs")).unwrap();
    dir
}

/// Stops a shell and what it started: SIGTERM to its process group.
fn stop(shell: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", "--", &format!("-{}", shell.id())])
        .status();
    let _ = shell.wait();
}

fn free_default_port() -> std::sync::MutexGuard<'static, ()> {
    let turn = DEFAULT_PORT.lock().unwrap_or_else(|e| e.into_inner());
    // The docs' commands name no address: they use the default one.
    drop(
        std::net::TcpListener::bind("127.0.0.1:8080")
            .expect("the docs' commands run on 127.0.0.1:8080, which another process holds"),
    );
    turn
}

/// Runs `steps` in one shell and checks what each printed against the lines shown under it
/// (in order; other lines may come between, such as a server's started with `&`).
fn run_session(what: &str, steps: &[(String, Step)]) {
    let dir = scratch();
    let mut script = String::from("exec 2>&1\n");
    for (i, (_, step)) in steps.iter().enumerate() {
        // A newline before the mark, for output that does not end in one (curl's).
        script += &format!(
            "echo '@@step {i}'\n{}\n__docs_rc=$?; printf '\\n@@rc %s\\n' \"$__docs_rc\"\n",
            step.command
        );
    }
    script += "echo '@@end'\n";
    let mut shell = bash(dir.path(), &script)
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let printed = BufReader::new(shell.stdout.take().unwrap());
    let mut sections: Vec<(Vec<String>, Option<i32>)> = Vec::new();
    for line in printed.lines() {
        let line = line.unwrap();
        if line.starts_with("@@step ") {
            sections.push((Vec::new(), None));
        } else if let Some(rc) = line.strip_prefix("@@rc ") {
            if let Some(section) = sections.last_mut() {
                section.1 = rc.parse().ok();
            }
        } else if line == "@@end" {
            break;
        } else if let Some(section) = sections.last_mut() {
            section.0.push(line);
        }
    }
    stop(&mut shell);
    // The next session serves on the same port: wait for this one's server to let it go.
    let freed = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpListener::bind("127.0.0.1:8080").is_err()
        && std::time::Instant::now() < freed
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        sections.len(),
        steps.len(),
        "{what}: the shell stopped early: {sections:?}"
    );
    for ((at, step), (printed, rc)) in steps.iter().zip(&sections) {
        assert_eq!(
            *rc,
            Some(0),
            "{at}: {:?} failed; it printed:\n{}",
            step.command,
            printed.join("\n")
        );
        let mut rest = printed.iter();
        for want in &step.shown {
            assert!(
                rest.any(|got| matches(want, got)),
                "{at}: {:?} printed\n{}\nwhere the docs show {want:?}",
                step.command,
                printed.join("\n")
            );
        }
    }
}

#[test]
fn every_shell_block_runs_or_says_why_not() {
    let mut sessions: Vec<(PathBuf, Vec<(String, Step)>)> = Vec::new();
    let mut not_run = Vec::new();
    for block in all_blocks("sh") {
        for step in steps(&block.text) {
            check_statically(&block, &step).unwrap_or_else(|e| panic!("{e}"));
        }
        match (&block.note, block.not_run()) {
            (_, Some(reason)) => {
                assert!(
                    reason.trim().len() > 10,
                    "{}: a block that is not run says why",
                    block.at()
                );
                not_run.push(block.at());
            }
            (Some(note), None) if note == QUICK_START => {}
            (Some(note), None) => panic!("{}: unknown note {note:?}", block.at()),
            (None, None) => {
                if sessions.last().is_none_or(|(page, _)| *page != block.page) {
                    sessions.push((block.page.clone(), Vec::new()));
                }
                let session = &mut sessions.last_mut().unwrap().1;
                session.extend(steps(&block.text).into_iter().map(|s| (block.at(), s)));
            }
        }
    }
    assert!(
        sessions
            .iter()
            .any(|(page, _)| page.ends_with("examples/README.md")),
        "the examples run: {sessions:?}"
    );
    let _turn = free_default_port();
    for (page, steps) in &sessions {
        run_session(&page.display().to_string(), steps);
    }
    eprintln!("not run (checked statically): {not_run:?}");
}

/// The README's quick start in its two shells: shell 1's blocking `serve`, then shell 2's
/// commands while it serves. The install block is checked by its command only: the
/// binary of this build stands in for the one `cargo install` puts on `PATH`.
#[test]
fn the_readme_quick_start_runs_as_written() {
    let quick_start: Vec<Block> = blocks(Path::new("README.md"))
        .into_iter()
        .filter(|b| b.note.as_deref() == Some(QUICK_START))
        .collect();
    assert_eq!(
        quick_start.len(),
        3,
        "install, shell 1, shell 2: {quick_start:?}"
    );
    assert!(quick_start[0]
        .text
        .starts_with("cargo install --locked --path ."));
    let (server, client) = (steps(&quick_start[1].text), steps(&quick_start[2].text));
    let _turn = free_default_port();
    let dir = scratch();

    // Shell 1: the server, its first lines as shown.
    let script: Vec<&str> = server.iter().map(|s| s.command.as_str()).collect();
    let shown: Vec<&String> = server.iter().flat_map(|s| &s.shown).collect();
    assert!(!shown.is_empty(), "shell 1 shows what serve prints");
    // Its own process group, so that the server bash starts goes with it.
    let mut shell = bash(dir.path(), &script.join("\n"))
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut printed = BufReader::new(shell.stdout.take().unwrap()).lines();
    for want in shown {
        let line = printed.next().expect("a line").unwrap();
        if !matches(want, &line) {
            stop(&mut shell);
            panic!("serve printed {line:?}, the README shows {want:?}");
        }
    }

    // Shell 2, command by command.
    let outcome = std::panic::catch_unwind(|| {
        for step in &client {
            let output = bash(dir.path(), &step.command).output().unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "{:?} failed: {stdout}{}",
                step.command,
                String::from_utf8_lossy(&output.stderr)
            );
            let lines: Vec<&str> = stdout.lines().collect();
            for (i, want) in step.shown.iter().enumerate() {
                let got = lines.get(i).copied().unwrap_or("");
                assert!(
                    matches(want, got),
                    "{:?} printed {got:?}, the README shows {want:?}",
                    step.command
                );
            }
        }
    });
    stop(&mut shell);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// The secrets each source or destination named in a block starts with, from the
/// environment variables a reader sets (`INHOOK_<NAME>_SECRET`, `INHOOK_DEST_<NAME>_SECRET`).
fn secrets_for(text: &str) -> HashMap<String, String> {
    // A file without sources serves the two default ones.
    let mut env: HashMap<String, String> = ["INHOOK_PRESENCE_SECRET", "INHOOK_SAVE_GAME_SECRET"]
        .map(|var| (var.to_owned(), "docs-test-secret-0123456789".to_owned()))
        .into();
    for line in text.lines() {
        let Some(name) = line
            .trim()
            .strip_prefix("name = \"")
            .and_then(|n| n.split('"').next())
        else {
            continue;
        };
        let name = name.to_uppercase().replace('-', "_");
        // As `user:password` too, for a `basic` source.
        let secret = "docs-user:docs-test-secret-0123456789";
        env.insert(format!("INHOOK_{name}_SECRET"), secret.to_owned());
        // A destination's, as `whsec_…` stands for in the docs.
        let signing_key = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        env.insert(format!("INHOOK_DEST_{name}_SECRET"), signing_key.to_owned());
    }
    env
}

/// Whether a loader error is about the block's own words (a key or a type the loader does
/// not know) rather than about what an excerpt leaves out.
fn wrong_words(error: &str) -> bool {
    error.contains("unknown field")
        || error.contains("unknown variant")
        || error.contains("invalid type")
}

#[test]
fn every_config_in_the_docs_loads() {
    let configs = all_blocks("toml");
    assert!(configs.len() > 10, "the docs' configs: {}", configs.len());
    for block in configs {
        let parsed: Result<toml::Table, _> = block.text.parse();
        if let Err(e) = parsed {
            panic!("{}: not TOML: {e}", block.at());
        }
        let excerpt = block
            .text
            .lines()
            .any(|l| l.trim() == "# …" || l.trim_end().ends_with("# …"));
        let env = secrets_for(&block.text);
        // The docs never show a master key a reader could paste into production: they write
        // where one goes in capitals, filled in here as the reader fills it in.
        let key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
        let text = [
            "NEW_BASE64_32_BYTES",
            "OLD_BASE64_32_BYTES",
            "BASE64_32_BYTES",
        ]
        .iter()
        .fold(block.text.clone(), |text, placeholder| {
            text.replace(placeholder, key)
        });
        match inhook::config::Config::from_parts(Some(&text), &env) {
            Ok(_) => {}
            Err(e) if excerpt && !wrong_words(&e.to_string()) => {}
            Err(e) => panic!("{}: the config does not load as written: {e}", block.at()),
        }
    }
}

#[test]
fn every_json_block_in_the_docs_is_json() {
    for block in all_blocks("json") {
        if let Err(e) = serde_json::from_str::<serde_json::Value>(&block.text) {
            panic!("{}: not JSON: {e}", block.at());
        }
    }
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines of a page outside its code blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut in_code = false;
    text.lines().filter(move |line| {
        let fence = line.trim_start().starts_with("```");
        in_code ^= fence;
        !in_code && !fence
    })
}

/// The anchors of a page's headings (a repeated heading's later ones end in `-1`, `-2`, …).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = BTreeSet::new();
    for line in prose(text) {
        // An anchor of its own: `<a id="name"></a>`.
        let mut rest = line;
        while let Some(at) = rest.find("<a id=\"") {
            rest = &rest[at + 7..];
            if let Some(end) = rest.find('"') {
                anchors.insert(rest[..end].to_owned());
            }
        }
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading);
        let count = seen.entry(base.clone()).or_default();
        anchors.insert(if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    anchors
}

/// The relative link targets of a page, outside code.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            if !target.contains("://") && !target.starts_with("mailto:") {
                found.push(target.to_owned());
            }
            rest = &rest[end..];
        }
    }
    found
}

#[test]
fn every_link_of_the_docs_leads_somewhere() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = read(&page);
        for target in links(&text) {
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let path = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            let full = repository().join(&path);
            if !full.exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
                continue;
            }
            if !anchor.is_empty()
                && !anchors(&std::fs::read_to_string(&full).unwrap_or_default()).contains(anchor)
            {
                broken.push(format!("{}: {target} (no such heading)", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_harness_reads_what_it_checks() {
    assert!(matches("a…c", "abbbc"));
    assert!(matches("{\"t\":\"…\",\"x\":1}", "{\"t\":\"2026\",\"x\":1}"));
    assert!(!matches("a…c", "abbbd"));
    assert!(matches("exact", "exact"));
    assert!(!matches("exact", "exactly"));
    assert_eq!(
        program("INHOOK_X=1 inhook send --header 'A: b' \"f.json\" > out # note"),
        ["inhook", "send", "--header", "A: b", "f.json"]
    );
    let parsed = steps("a \\\n  b\n# shown\n\n# comment\nc <<'EOF'\nx\nEOF\n");
    assert_eq!(parsed.len(), 2);
    assert_eq!(parsed[0].command, "a \\\n  b");
    assert_eq!(parsed[0].shown, ["shown"]);
    assert_eq!(parsed[1].command, "c <<'EOF'\nx\nEOF");
    assert_eq!(
        slug("`[[destinations]]`: forwarding applied events"),
        "destinations-forwarding-applied-events"
    );
    assert_eq!(
        anchors("# A\n## B b\n```\n# not\n```\n## B b\n")
            .into_iter()
            .collect::<Vec<_>>(),
        ["a", "b-b", "b-b-1"]
    );
}
