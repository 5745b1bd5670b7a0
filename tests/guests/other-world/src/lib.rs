//! Test plugin: a well-formed component that implements some other world
//! (it exports `greet`, not `handle` or `handle-batch`), for `shardlane
//! check` to refuse.

wit_bindgen::generate!({
    inline: "
        package test:other;
        world other {
            export greet: func() -> string;
        }
    ",
});

struct Other;

impl Guest for Other {
    fn greet() -> String {
        "hello".to_owned()
    }
}

export!(Other);
