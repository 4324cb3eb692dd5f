//! The extension module that `cargo test --workspace` builds beside this test (the library's
//! cdylib, which scripts/test_python.sh installs for the Python suites) exists and exports
//! the function Python calls to import `strata._strata`.

#[test]
fn the_extension_module_exports_its_init_function() {
    let deps = std::env::current_exe().unwrap();
    let name = format!(
        "{}_strata{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let module = deps.parent().unwrap().join(name);
    let bytes = std::fs::read(&module)
        .unwrap_or_else(|e| panic!("{}: {e} (built with the tests)", module.display()));
    let init = b"PyInit__strata";
    assert!(
        bytes.windows(init.len()).any(|w| w == init),
        "{} does not export PyInit__strata",
        module.display()
    );
}
