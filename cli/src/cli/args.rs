//! The flags made from the tables every front door shares: the dataset options and the
//! loader settings.

use super::*;

/// How to read a dataset: the flags are made from [`DATASET_OPTIONS`], the one table that the
/// Rust `OpenOptions`, Python's keyword arguments and the C options struct follow too.
#[derive(Debug, Clone, Default)]
pub(super) struct DatasetArgs {
    /// (option name, value) for every flag given.
    pub(super) given: Vec<(&'static str, String)>,
}

impl clap::FromArgMatches for DatasetArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> std::result::Result<Self, clap::Error> {
        let mut a = DatasetArgs::default();
        a.update_from_arg_matches(m)?;
        Ok(a)
    }

    fn update_from_arg_matches(
        &mut self,
        m: &clap::ArgMatches,
    ) -> std::result::Result<(), clap::Error> {
        for o in DATASET_OPTIONS {
            let v = if o.boolean {
                m.get_flag(o.name).then(|| "true".to_string())
            } else {
                m.get_one::<String>(o.name).cloned()
            };
            if let Some(v) = v {
                self.given.retain(|(k, _)| *k != o.name);
                self.given.push((o.name, v));
            }
        }
        Ok(())
    }
}

impl clap::Args for DatasetArgs {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        for o in DATASET_OPTIONS {
            let arg = clap::Arg::new(o.name)
                .long(o.flag)
                .help_heading("Dataset options");
            cmd = cmd.arg(if o.boolean {
                arg.action(clap::ArgAction::SetTrue).help(o.help)
            } else {
                arg.value_name("VALUE")
                    .help(format!("{} [default: {}]", o.help, o.default))
            });
        }
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl DatasetArgs {
    pub(super) fn options(&self) -> Result<OpenOptions> {
        let mut opts = OpenOptions::default();
        for (k, v) in &self.given {
            opts.set(k, v)?;
        }
        Ok(opts)
    }

    pub(super) fn open(&self, paths: &[PathBuf]) -> Result<gpufeed::dataset::Dataset> {
        gpufeed::dataset::Dataset::open_paths(paths, &self.options()?)
    }
}

/// The loader settings a command takes: the flags are made from [`LOADER_SETTINGS`] (those the
/// CLI door takes), the table Python's keyword arguments and the C options struct follow too.
#[derive(Debug, Clone, Default)]
pub(super) struct LoaderArgs {
    /// (setting name, value) for every flag given.
    pub(super) given: Vec<(&'static str, String)>,
}

/// Flags that were spelt otherwise before the table: (setting, old flag).
pub(super) const LOADER_FLAG_ALIASES: &[(&str, &str)] =
    &[("batch_size", "batch"), ("queue_depth", "qd")];

impl clap::FromArgMatches for LoaderArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> std::result::Result<Self, clap::Error> {
        let mut a = LoaderArgs::default();
        a.update_from_arg_matches(m)?;
        Ok(a)
    }

    fn update_from_arg_matches(
        &mut self,
        m: &clap::ArgMatches,
    ) -> std::result::Result<(), clap::Error> {
        for o in LOADER_SETTINGS.iter().filter(|o| o.at(FrontDoor::Cli)) {
            if let Some(v) = m.get_one::<String>(o.name) {
                self.given.retain(|(k, _)| *k != o.name);
                self.given.push((o.name, v.clone()));
            }
        }
        if m.get_flag("no_verify") {
            self.given.retain(|(k, _)| *k != "verify");
            self.given.push(("verify", "false".into()));
        }
        Ok(())
    }
}

impl clap::Args for LoaderArgs {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        for o in LOADER_SETTINGS.iter().filter(|o| o.at(FrontDoor::Cli)) {
            let mut arg = clap::Arg::new(o.name)
                .long(o.flag)
                .value_name("VALUE")
                .help_heading("Loader settings")
                .help(format!(
                    "{}{} [default: {}]",
                    o.help,
                    if o.unit.is_empty() || o.unit.contains(' ') {
                        String::new()
                    } else {
                        format!(" ({})", o.unit)
                    },
                    o.default
                ));
            for (_, old) in LOADER_FLAG_ALIASES.iter().filter(|(n, _)| *n == o.name) {
                arg = arg.visible_alias(*old);
            }
            cmd = cmd.arg(arg);
        }
        cmd.arg(
            clap::Arg::new("no_verify")
                .long("no-verify")
                .action(clap::ArgAction::SetTrue)
                .help_heading("Loader settings")
                .help("--verify false"),
        )
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl LoaderArgs {
    /// The settings the flags give, over the table's defaults and the environment's.
    pub(super) fn settings(&self) -> Result<LoaderSettings> {
        let mut s = LoaderSettings::from_env()?;
        for (k, v) in &self.given {
            s.set(k, v).map_err(|e| {
                crate::util::invalid(format!("--{}: {}", k.replace('_', "-"), e.message()))
            })?;
        }
        Ok(s)
    }
}
