//! A workflow project in a temporary directory: a `prompts/` folder and the files a test
//! writes, compiled in process when a test asks for its plan.

use std::path::PathBuf;
use std::sync::Arc;

use runner::compile::{Plan, compile_file};

pub(crate) struct Project {
    pub dir: tempfile::TempDir,
}

impl Project {
    /// A project holding `files` (relative path, text), folders created as needed.
    pub(crate) fn new(files: &[(&str, &str)]) -> Project {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("prompts")).unwrap();
        let project = Project { dir };
        for (name, text) in files {
            project.write(name, text);
        }
        project
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes `text` to `rel`, creating its folders.
    pub(crate) fn write(&self, rel: &str, text: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// The plan of the workflow `name`, which must compile without errors.
    pub(crate) fn plan(&self, name: &str) -> Arc<Plan> {
        let (plan, result) = compile_file(&self.path(name), &runner::nodes::builtin().decls());
        assert!(
            result.diagnostics.iter().all(|d| !d.is_error()),
            "{:#?}",
            result.diagnostics
        );
        plan.unwrap()
    }
}
