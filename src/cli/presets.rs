//! `inhook presets` (docs/providers.md): list the presets, or print one as a
//! `[[sources]]` table ready to paste. A thin layer over [`inhook::ingress::presets`].

use anyhow::bail;

/// Arguments of `inhook presets`.
#[derive(Debug, clap::Args)]
pub struct PresetsArgs {
    /// The preset to print as a `[[sources]]` table; without it, every preset is listed.
    pub name: Option<String>,
}

/// Runs `inhook presets`.
pub fn presets(args: PresetsArgs) -> anyhow::Result<()> {
    print!("{}", output(args.name.as_deref())?);
    Ok(())
}

/// What `inhook presets [NAME]` prints.
pub fn output(name: Option<&str>) -> anyhow::Result<String> {
    use inhook::ingress::presets::Preset;
    let Some(name) = name else {
        let mut rows = vec![[
            "NAME".to_owned(),
            "PUBLISHER".to_owned(),
            "SCHEME".to_owned(),
            "HANDSHAKE".to_owned(),
        ]];
        for preset in Preset::all() {
            let about = preset.about().map_err(anyhow::Error::msg)?;
            rows.push([
                preset.name.to_owned(),
                about.publisher,
                about.scheme,
                about.handshake.unwrap_or_else(|| "-".to_owned()),
            ]);
        }
        let widths: Vec<usize> = (0..4)
            .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for row in rows {
            let line: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            out.push_str(line.join("  ").trim_end());
            out.push('\n');
        }
        out.push_str(
            "\n`inhook presets NAME` prints one as a [[sources]] table; docs/providers.md describes each.\n",
        );
        return Ok(out);
    };
    match Preset::find(name) {
        Some(preset) => preset.paste().map_err(anyhow::Error::msg),
        None => {
            let close = inhook::ingress::presets::close_names(name);
            if close.is_empty() {
                bail!("no preset {name:?}: `inhook presets` lists them")
            }
            bail!(
                "no preset {name:?}: did you mean {}? (`inhook presets` lists them)",
                close.join(", ")
            )
        }
    }
}
