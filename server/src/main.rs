//! proxy-server: not built yet (see the issues "proxy-server" and "proxy-agent").
//! It refuses to start rather than pretend to work.

fn main() {
    eprintln!("proxy-server: not implemented yet in this build of konn");
    std::process::exit(1);
}
