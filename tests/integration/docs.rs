//! The README's quick start, run as written (docs/… say what a user pastes): each command of
//! its two shells runs through `bash` with the built binary first on `PATH`, and what it
//! prints is checked against the `# …` lines written under it (`…` stands for any text).
//! As written means on the default address, `127.0.0.1:8080`: the test needs that port free.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// One shell command of a code block and the output lines shown under it.
#[derive(Debug)]
struct Step {
    command: String,
    shown: Vec<String>,
}

/// The `sh` code blocks of the README section headed `heading`, in order.
fn shell_blocks(readme: &str, heading: &str) -> Vec<Vec<Step>> {
    let start = readme
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("README has no {heading:?}"));
    let section = &readme[start + heading.len() + 2..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut blocks = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "```sh" {
            continue;
        }
        let mut steps: Vec<Step> = Vec::new();
        for line in lines.by_ref() {
            if line.trim() == "```" {
                break;
            }
            if let Some(shown) = line.strip_prefix("# ") {
                if let Some(step) = steps.last_mut() {
                    step.shown.push(shown.to_owned());
                }
            } else if !line.trim().is_empty() {
                steps.push(Step {
                    command: line.to_owned(),
                    shown: Vec::new(),
                });
            }
        }
        blocks.push(steps);
    }
    blocks
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

fn bash(dir: &Path, path: &str, command: &str) -> Command {
    let mut bash = Command::new("bash");
    bash.arg("-c")
        .arg(command)
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("INHOOK_ADMIN_TOKEN")
        .env_remove("INHOOK_DATABASE")
        .env_remove("INHOOK_LISTEN")
        .env_remove("INHOOK_CONFIG");
    bash
}

/// Stops shell 1 and the server it started: SIGTERM to its process group.
fn stop(shell: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", "--", &format!("-{}", shell.id())])
        .status();
    let _ = shell.wait();
}

/// The install block is checked by its command only: the binary of this build stands in for
/// the one `cargo install` puts on `PATH`.
#[test]
fn the_readme_quick_start_runs_as_written() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let blocks = shell_blocks(&readme, "## Quick start");
    assert_eq!(blocks.len(), 3, "install, shell 1, shell 2: {blocks:?}");
    assert!(blocks[0][0]
        .command
        .starts_with("cargo install --locked --path ."));
    // The quick start's commands name no address: they use the default one.
    drop(
        std::net::TcpListener::bind("127.0.0.1:8080")
            .expect("the README's quick start runs on 127.0.0.1:8080, which another process holds"),
    );
    let here = |text: &str| text.to_owned();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_inhook")).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    let dir = tempfile::tempdir().unwrap();

    // Shell 1: the server, its first lines as shown.
    let server_script = blocks[1]
        .iter()
        .map(|s| here(&s.command))
        .collect::<Vec<_>>()
        .join("\n");
    let shown: Vec<String> = blocks[1]
        .iter()
        .flat_map(|s| s.shown.iter().map(|l| here(l)))
        .collect();
    assert!(!shown.is_empty(), "shell 1 shows what serve prints");
    // Its own process group, so that the server bash starts goes with it.
    let mut server = bash(dir.path(), &path, &server_script)
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut printed = BufReader::new(server.stdout.take().unwrap()).lines();
    for want in &shown {
        let line = printed.next().expect("a line").unwrap();
        if !matches(want, &line) {
            stop(&mut server);
            panic!("serve printed {line:?}, the README shows {want:?}");
        }
    }

    // Shell 2, command by command.
    let outcome = std::panic::catch_unwind(|| {
        for step in &blocks[2] {
            let output = bash(dir.path(), &path, &here(&step.command))
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "{:?} failed: {stdout}{}",
                step.command,
                String::from_utf8_lossy(&output.stderr)
            );
            let lines: Vec<&str> = stdout.lines().collect();
            for (i, want) in step.shown.iter().map(|l| here(l)).enumerate() {
                let got = lines.get(i).copied().unwrap_or("");
                assert!(
                    matches(&want, got),
                    "{:?} printed {got:?}, the README shows {want:?}",
                    step.command
                );
            }
        }
    });
    stop(&mut server);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn shown_output_matches_with_ellipses() {
    assert!(matches("a…c", "abbbc"));
    assert!(matches("{\"t\":\"…\",\"x\":1}", "{\"t\":\"2026\",\"x\":1}"));
    assert!(!matches("a…c", "abbbd"));
    assert!(matches("exact", "exact"));
    assert!(!matches("exact", "exactly"));
}
