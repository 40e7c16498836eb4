//! The `gpufeed` command: see `gpufeed --help`.

fn main() -> std::process::ExitCode {
    gpufeed::cli::main()
}
