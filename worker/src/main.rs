//! The `worker` binary. Serving experts over QUIC arrives with cluster mode;
//! today it reports its version and says so.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let version = env!("CARGO_PKG_VERSION");
    if args.iter().any(|a| a == "--version" || a == "-V") {
        println!("worker {version}");
        return;
    }
    println!("worker {version} (protocol {})", charm_proto::PROTOCOL_VERSION);
    if !args.is_empty() {
        eprintln!("error: the worker does not serve over the network yet; run `coordinator --local` on one machine");
        std::process::exit(2);
    }
}
