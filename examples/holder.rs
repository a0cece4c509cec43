//! Stand-in for `berth __holder` until the CLI grows that hidden mode: the
//! container helper process that `berth::container::spawn_holder` starts.

fn main() {
    berth::container::holder_main()
}
