//! The `gpufeed` command: see `gpufeed --help`.

fn main() -> std::process::ExitCode {
    gpufeed_cli::cli::main()
}
