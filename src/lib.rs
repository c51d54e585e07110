//! The `inhook` server: its command line, one module per command, over the core library
//! (the crate `inhook`, crates/core) and the tools (`inhook bench`, `inhook simulate`, the
//! crate `inhook_tools`, crates/tools).

pub mod cli;
