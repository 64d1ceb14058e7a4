//! PowerPoint templates in workflows/slides.yaml: `load` reads the .pptx into the design
//! context the visualizer designs from, and the image requests carry each spec's seed and its
//! layout's reference picture when the image API takes them — through the real binary against
//! a recording fake image API.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use crate::support::{self, fake_web};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Runs workflows/slides.yaml on the template mock with the fixture template, its images sent
/// to `api`: the run's output and the bodies the API received, in slide order.
fn run_slides(api: &fake_web::Recorder, template: &str, extra: &[&str]) -> (Value, Vec<Value>) {
    let p = support::Project::new(&[]);
    std::fs::copy(
        Path::new(ROOT).join("tests/fixtures/pptx/template.pptx"),
        p.path("template.pptx"),
    )
    .unwrap();
    let out = Command::new(assert_cmd::cargo::cargo_bin("runner"))
        .current_dir(p.dir.path())
        .env_remove("RUNNER_ALLOW_NET")
        .env_remove("RUNNER_ALLOW_READ")
        .env("OPENAI_API_KEY", "test-key")
        .arg("run")
        .arg(Path::new(ROOT).join("workflows/slides.yaml"))
        .arg("--mock")
        .arg(Path::new(ROOT).join("tests/fixtures/mock/slides-template.yaml"))
        .args(["--db", ":memory:", "--allow-read", ".", "--allow-net", "127.0.0.1"])
        .args([
            "--set",
            &format!("images.endpoint={}", api.url("/v1/images/generations")),
        ])
        .args([
            "-i",
            "request=A title slide on heat pumps",
            "-i",
            &format!("template={template}"),
        ])
        .args(extra)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let output: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut bodies: Vec<Value> = api
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|r| serde_json::from_str(r["body"].as_str().unwrap()).unwrap())
        .collect();
    bodies.sort_by_key(|b| b["prompt"].as_str().unwrap_or("").to_string());
    (output, bodies)
}

fn image_api() -> fake_web::Recorder {
    fake_web::recorder(200, json!({"data": [{"b64_json": "aW1n"}]}))
}

/// The template's layouts reach the visualizer (the mock only designs when the prompt lists
/// them with the placeholder regions read from the .pptx), and with `images.control` every
/// image request carries its spec's seed — kept across the deep edit — and the reference
/// picture of the layout it names (null for a layout without one).
#[test]
fn the_seed_and_the_layouts_reference_picture_reach_the_image_request() {
    let api = image_api();
    let (out, bodies) = run_slides(&api, "template.pptx", &["--set", "images.control=true"]);
    assert_eq!(
        out["plan"],
        json!([
            {"id": 1, "role": "visualizer", "status": "complete", "result_summary": "Template-based title image.",
             "instruction": "Design the title slide with the user's template.", "description": "Design"},
            {"id": 2, "role": "visualizer", "status": "complete", "result_summary": "Warmer title image, same seed.",
             "instruction": "Make the title image warmer; keep the rest.", "description": "Warmer image"},
        ]),
        "{out:#}"
    );
    assert_eq!(bodies.len(), 3, "{bodies:#?}");
    let [close_up, warm, first] = [&bodies[0], &bodies[1], &bodies[2]];
    assert!(first["prompt"].as_str().unwrap().starts_with("A modern house"));
    assert!(warm["prompt"].as_str().unwrap().starts_with("A house at warm dusk"));
    assert_eq!(
        (first["seed"].as_i64(), warm["seed"].as_i64()),
        (Some(4242), Some(4242))
    );
    for b in [first, warm] {
        assert!(
            b["control_image"]
                .as_str()
                .unwrap_or("")
                .starts_with("data:image/png;base64,iVBOR"),
            "{b:#}"
        );
        assert_eq!(b["model"], "gpt-image-1");
    }
    assert_eq!(close_up["seed"], 77);
    assert_eq!(
        close_up["control_image"],
        Value::Null,
        "the Title Slide layout has no picture"
    );
    assert_eq!(
        out["artifacts"]["step_2_image_1"]["seed"], 4242,
        "{:#}",
        out["artifacts"]
    );
}

/// OpenAI's generations endpoint (the default) refuses fields it does not know: without
/// `images.control` neither is sent.
#[test]
fn without_control_the_image_request_is_openais() {
    let api = image_api();
    let (_, bodies) = run_slides(&api, "template.pptx", &[]);
    assert_eq!(bodies.len(), 3);
    for b in &bodies {
        let mut keys: Vec<&str> = b.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["model", "n", "prompt", "quality", "size"], "{b:#}");
    }
}
