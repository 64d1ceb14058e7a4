//! PowerPoint templates (`.pptx`) read into a design context: the slide size, the theme's
//! colours and fonts, every layout with its placeholders (type and position) and reference
//! picture, and each slide's text. A document is untrusted input: the package is a zip read
//! with a cap on the uncompressed bytes of every part and of all parts together (a zip bomb
//! fails with [`PptxError::TooLarge`]), and every malformed part is a typed error.

use std::collections::HashMap;
use std::io::{Cursor, Read};

use base64::Engine as _;
use serde_json::{Map, Value, json};

/// Most uncompressed bytes read from one XML part.
const MAX_PART_BYTES: u64 = 8 << 20;
/// Most uncompressed bytes read from the package in all.
const MAX_TOTAL_BYTES: u64 = 64 << 20;
/// Largest layout picture carried as a data URL (larger ones are named, not embedded).
const MAX_PICTURE_BYTES: u64 = 1 << 20;
/// Most slides, masters and layouts read.
const MAX_PARTS: usize = 500;

/// Why a `.pptx` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PptxError {
    #[error("the file is not a PPTX package (zip): {0}")]
    NotZip(String),
    #[error("the package has no `{0}` part")]
    Missing(String),
    #[error("`{part}` could not be read: {message}")]
    Part { part: String, message: String },
    #[error("`{part}` is not well-formed XML: {message}")]
    Xml { part: String, message: String },
    #[error("the package unpacks to more than {cap} bytes (at `{part}`); refused as a possible zip bomb")]
    TooLarge { part: String, cap: u64 },
    #[error("the package has more than {MAX_PARTS} {0}")]
    TooMany(&'static str),
}

const NS_R: &str = "http://schemas.openxmlformats.org/officeDocument/2006/relationships";

/// A zip package read under the byte caps.
struct Package {
    zip: zip::ZipArchive<Cursor<Vec<u8>>>,
    read: u64,
}

impl Package {
    fn part(&mut self, name: &str) -> Result<Option<Vec<u8>>, PptxError> {
        self.part_capped(name, MAX_PART_BYTES)
    }

    /// The bytes of a part, `None` when absent; more than `cap` bytes (or more than the
    /// package's total) is `TooLarge`, whatever the zip's headers claim.
    fn part_capped(&mut self, name: &str, cap: u64) -> Result<Option<Vec<u8>>, PptxError> {
        let entry = match self.zip.by_name(name) {
            Ok(entry) => entry,
            Err(zip::result::ZipError::FileNotFound) => return Ok(None),
            Err(e) => {
                return Err(PptxError::Part {
                    part: name.into(),
                    message: e.to_string(),
                });
            }
        };
        let left = MAX_TOTAL_BYTES.saturating_sub(self.read);
        let limit = cap.min(left);
        let mut bytes = Vec::new();
        entry
            .take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| PptxError::Part {
                part: name.into(),
                message: e.to_string(),
            })?;
        if bytes.len() as u64 > limit {
            let cap = if limit == cap { cap } else { MAX_TOTAL_BYTES };
            return Err(PptxError::TooLarge { part: name.into(), cap });
        }
        self.read += bytes.len() as u64;
        Ok(Some(bytes))
    }

    fn xml(&mut self, name: &str) -> Result<Option<String>, PptxError> {
        let Some(bytes) = self.part(name)? else {
            return Ok(None);
        };
        String::from_utf8(bytes).map(Some).map_err(|_| PptxError::Xml {
            part: name.into(),
            message: "not UTF-8".into(),
        })
    }

    fn required_xml(&mut self, name: &str) -> Result<String, PptxError> {
        self.xml(name)?.ok_or_else(|| PptxError::Missing(name.into()))
    }

    /// A part's relationships: id → (type, target part name).
    fn rels(&mut self, part: &str) -> Result<HashMap<String, (String, String)>, PptxError> {
        let (dir, file) = part.rsplit_once('/').unwrap_or(("", part));
        let name = format!("{dir}/_rels/{file}.rels");
        let Some(text) = self.xml(&name)? else {
            return Ok(HashMap::new());
        };
        let doc = parse(&name, &text)?;
        Ok(doc
            .root_element()
            .children()
            .filter(|n| n.has_tag_name("Relationship") && n.attribute("TargetMode") != Some("External"))
            .filter_map(|n| {
                let id = n.attribute("Id")?;
                let kind = n.attribute("Type")?.rsplit('/').next()?;
                Some((id.to_string(), (kind.to_string(), resolve(dir, n.attribute("Target")?))))
            })
            .collect())
    }
}

fn parse<'a>(part: &str, text: &'a str) -> Result<roxmltree::Document<'a>, PptxError> {
    roxmltree::Document::parse(text).map_err(|e| PptxError::Xml {
        part: part.into(),
        message: e.to_string(),
    })
}

/// A relationship target, relative to the source part's directory, as a part name.
fn resolve(dir: &str, target: &str) -> String {
    let mut parts: Vec<&str> = if target.starts_with('/') {
        Vec::new()
    } else {
        dir.split('/').filter(|p| !p.is_empty()).collect()
    };
    for seg in target.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    parts.join("/")
}

/// The first descendant named `name` (any namespace).
fn find<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    node.descendants().find(|n| n.tag_name().name() == name)
}

fn child<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    node.children().find(|n| n.tag_name().name() == name)
}

fn rid(node: roxmltree::Node<'_, '_>, name: &str) -> Option<String> {
    node.attribute((NS_R, name)).map(str::to_string)
}

/// A read template: `value` is what `load` returns as `content`.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    pub value: Value,
    /// The slides' text, slide by slide.
    pub slide_text: Vec<String>,
    pub title: Option<String>,
}

/// A placeholder: its type (`title`, `body`, `pic`, … as PowerPoint names them; `obj` when
/// unnamed), index and position in EMU (inherited from the master when the layout leaves it).
#[derive(Debug, Clone)]
struct Placeholder {
    kind: String,
    idx: Option<u64>,
    name: String,
    position: Option<[i64; 4]>,
}

impl Placeholder {
    fn to_value(&self, size: (i64, i64)) -> Value {
        let position = self.position.map(|[x, y, w, h]| {
            let frac = |v: i64, of: i64| {
                if of > 0 {
                    (v as f64 / of as f64 * 1000.0).round() / 1000.0
                } else {
                    0.0
                }
            };
            json!({"x": x, "y": y, "width": w, "height": h,
                   "relative": {"left": frac(x, size.0), "top": frac(y, size.1),
                                "width": frac(w, size.0), "height": frac(h, size.1)}})
        });
        json!({"type": self.kind, "idx": self.idx, "name": self.name, "position": position})
    }
}

/// Placeholders of a slide, layout or master tree.
fn placeholders(root: roxmltree::Node<'_, '_>) -> Vec<Placeholder> {
    let Some(tree) = find(root, "spTree") else {
        return Vec::new();
    };
    tree.descendants()
        .filter(|n| n.tag_name().name() == "ph")
        .filter_map(|ph| {
            let shape = ph
                .ancestors()
                .find(|n| matches!(n.tag_name().name(), "sp" | "pic" | "graphicFrame"))?;
            let name = find(shape, "cNvPr").and_then(|n| n.attribute("name")).unwrap_or("");
            let position = find(shape, "xfrm").and_then(|xfrm| {
                let off = child(xfrm, "off")?;
                let ext = child(xfrm, "ext")?;
                let num = |n: roxmltree::Node<'_, '_>, a: &str| n.attribute(a).and_then(|v| v.parse::<i64>().ok());
                Some([num(off, "x")?, num(off, "y")?, num(ext, "cx")?, num(ext, "cy")?])
            });
            Some(Placeholder {
                kind: ph.attribute("type").unwrap_or("obj").to_string(),
                idx: ph.attribute("idx").and_then(|v| v.parse().ok()),
                name: name.to_string(),
                position,
            })
        })
        .collect()
}

/// The master placeholder a layout's placeholder inherits its position from.
fn master_family(kind: &str) -> &str {
    match kind {
        "title" | "ctrTitle" => "title",
        "dt" | "ftr" | "sldNum" => kind,
        _ => "body",
    }
}

/// Each text box's paragraphs, one line each; shapes separated by a blank line.
fn shape_texts(root: roxmltree::Node<'_, '_>) -> Vec<(Option<String>, String)> {
    let Some(tree) = find(root, "spTree") else {
        return Vec::new();
    };
    tree.descendants()
        .filter(|n| n.tag_name().name() == "txBody")
        .map(|body| {
            let kind = body
                .parent()
                .and_then(|sp| find(sp, "ph"))
                .map(|ph| ph.attribute("type").unwrap_or("obj").to_string());
            let text = body
                .children()
                .filter(|p| p.tag_name().name() == "p")
                .map(|p| {
                    p.descendants()
                        .filter(|t| t.tag_name().name() == "t" || t.tag_name().name() == "br")
                        .map(|t| {
                            if t.tag_name().name() == "br" {
                                "\n"
                            } else {
                                t.text().unwrap_or("")
                            }
                        })
                        .collect::<String>()
                })
                .collect::<Vec<_>>()
                .join("\n");
            (kind, text.trim().to_string())
        })
        .filter(|(_, t)| !t.is_empty())
        .collect()
}

/// A theme colour as `#RRGGBB` (a system colour by its last value).
fn colour(node: roxmltree::Node<'_, '_>) -> Option<String> {
    let c = node.children().find(|n| n.is_element())?;
    let hex = match c.tag_name().name() {
        "srgbClr" => c.attribute("val")?,
        "sysClr" => c.attribute("lastClr")?,
        _ => return None,
    };
    (hex.len() == 6 && hex.chars().all(|c| c.is_ascii_hexdigit())).then(|| format!("#{}", hex.to_ascii_uppercase()))
}

fn theme(pkg: &mut Package, part: Option<&str>) -> Result<(Value, Map<String, Value>, Value), PptxError> {
    let Some(part) = part else {
        return Ok((Value::Null, Map::new(), json!({"heading": null, "body": null})));
    };
    let text = pkg.required_xml(part)?;
    let doc = parse(part, &text)?;
    let root = doc.root_element();
    let name = root.attribute("name").map_or(Value::Null, |n| json!(n));
    let mut colors = Map::new();
    if let Some(scheme) = find(root, "clrScheme") {
        for c in scheme.children().filter(|n| n.is_element()) {
            if let Some(hex) = colour(c) {
                colors.insert(c.tag_name().name().to_string(), json!(hex));
            }
        }
    }
    let typeface = |which: &str| {
        find(root, "fontScheme")
            .and_then(|s| child(s, which))
            .and_then(|f| child(f, "latin"))
            .and_then(|l| l.attribute("typeface"))
            .map_or(Value::Null, |t| json!(t))
    };
    let fonts = json!({"heading": typeface("majorFont"), "body": typeface("minorFont")});
    Ok((name, colors, fonts))
}

/// The first picture a layout shows (its background fill or a picture shape), as a data URL
/// when small enough, else by part name.
fn picture(
    pkg: &mut Package,
    root: roxmltree::Node<'_, '_>,
    rels: &HashMap<String, (String, String)>,
) -> Result<Value, PptxError> {
    let Some(target) = root
        .descendants()
        .filter(|n| n.tag_name().name() == "blip")
        .filter_map(|b| rid(b, "embed"))
        .find_map(|id| {
            rels.get(&id)
                .filter(|(kind, _)| kind == "image")
                .map(|(_, t)| t.clone())
        })
    else {
        return Ok(Value::Null);
    };
    let mime = match target.rsplit('.').next().map(str::to_ascii_lowercase).as_deref() {
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("svg") => "image/svg+xml",
        _ => return Ok(json!({"part": target, "data_url": null})),
    };
    let data_url = match pkg.part_capped(&target, MAX_PICTURE_BYTES) {
        Ok(Some(bytes)) => json!(format!(
            "data:{mime};base64,{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )),
        Ok(None) | Err(PptxError::TooLarge { .. }) => Value::Null,
        Err(e) => return Err(e),
    };
    Ok(json!({"part": target, "data_url": data_url}))
}

/// Reads a `.pptx` package into its design context.
pub fn read(bytes: &[u8]) -> Result<Template, PptxError> {
    let zip = zip::ZipArchive::new(Cursor::new(bytes.to_vec())).map_err(|e| PptxError::NotZip(e.to_string()))?;
    let mut pkg = Package { zip, read: 0 };
    let pres_part = "ppt/presentation.xml";
    let pres_text = pkg.required_xml(pres_part)?;
    let pres = parse(pres_part, &pres_text)?;
    let pres_root = pres.root_element();
    let pres_rels = pkg.rels(pres_part)?;
    let size = find(pres_root, "sldSz")
        .map(|s| {
            let n = |a| s.attribute(a).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
            (n("cx"), n("cy"))
        })
        .unwrap_or((0, 0));
    let ids = |list: &str, item: &str| -> Vec<String> {
        find(pres_root, list)
            .map(|l| {
                l.children()
                    .filter(|n| n.tag_name().name() == item)
                    .filter_map(|n| rid(n, "id"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let target = |id: &String| pres_rels.get(id).map(|(_, t)| t.clone());
    let masters: Vec<String> = ids("sldMasterIdLst", "sldMasterId").iter().filter_map(target).collect();
    let slides: Vec<String> = ids("sldIdLst", "sldId").iter().filter_map(target).collect();
    if masters.len() > MAX_PARTS {
        return Err(PptxError::TooMany("slide masters"));
    }
    if slides.len() > MAX_PARTS {
        return Err(PptxError::TooMany("slides"));
    }

    let mut theme_part = pres_rels.values().find(|(k, _)| k == "theme").map(|(_, t)| t.clone());
    let mut layouts = Vec::new();
    let mut layout_names: HashMap<String, String> = HashMap::new();
    for master in &masters {
        let text = pkg.required_xml(master)?;
        let doc = parse(master, &text)?;
        let rels = pkg.rels(master)?;
        if let Some((_, t)) = rels.values().find(|(k, _)| k == "theme") {
            theme_part.get_or_insert_with(|| t.clone());
        }
        let inherited: HashMap<String, [i64; 4]> = placeholders(doc.root_element())
            .into_iter()
            .filter_map(|p| Some((master_family(&p.kind).to_string(), p.position?)))
            .collect();
        let layout_ids: Vec<String> = find(doc.root_element(), "sldLayoutIdLst")
            .map(|l| l.children().filter_map(|n| rid(n, "id")).collect())
            .unwrap_or_default();
        for id in layout_ids {
            if layouts.len() >= MAX_PARTS {
                return Err(PptxError::TooMany("slide layouts"));
            }
            let Some((_, part)) = rels.get(&id) else { continue };
            let part = part.clone();
            let text = pkg.required_xml(&part)?;
            let doc = parse(&part, &text)?;
            let root = doc.root_element();
            let name = find(root, "cSld")
                .and_then(|c| c.attribute("name"))
                .unwrap_or("")
                .to_string();
            let layout_rels = pkg.rels(&part)?;
            let image = picture(&mut pkg, root, &layout_rels)?;
            let phs: Vec<Value> = placeholders(root)
                .into_iter()
                .map(|mut p| {
                    if p.position.is_none() {
                        p.position = inherited.get(master_family(&p.kind)).copied();
                    }
                    p.to_value(size)
                })
                .collect();
            layout_names.insert(part.clone(), name.clone());
            layouts.push(json!({
                "name": name,
                "type": root.attribute("type").unwrap_or("cust"),
                "placeholders": phs,
                "image": image,
            }));
        }
    }
    let (theme_name, colors, fonts) = theme(&mut pkg, theme_part.as_deref())?;

    let mut slide_values = Vec::new();
    let mut slide_text = Vec::new();
    let mut first_title = None;
    for (i, part) in slides.iter().enumerate() {
        let text = pkg.required_xml(part)?;
        let doc = parse(part, &text)?;
        let rels = pkg.rels(part)?;
        let layout = rels
            .values()
            .find(|(k, _)| k == "slideLayout")
            .and_then(|(_, t)| layout_names.get(t))
            .map_or(Value::Null, |n| json!(n));
        let shapes = shape_texts(doc.root_element());
        let title = shapes
            .iter()
            .find(|(k, _)| matches!(k.as_deref(), Some("title" | "ctrTitle")))
            .map(|(_, t)| t.clone());
        if first_title.is_none() {
            first_title.clone_from(&title);
        }
        let texts: Vec<&str> = shapes.iter().map(|(_, t)| t.as_str()).collect();
        slide_text.push(texts.join("\n\n"));
        slide_values.push(json!({"number": i + 1, "layout": layout, "title": title, "text": texts}));
    }

    let title = match pkg.xml("docProps/core.xml")? {
        Some(core) => parse("docProps/core.xml", &core)?
            .descendants()
            .find(|n| n.tag_name().name() == "title")
            .and_then(|n| n.text())
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string),
        None => None,
    }
    .or(first_title);

    let aspect = aspect(size);
    let value = json!({
        "theme_name": theme_name,
        "colors": colors,
        "fonts": fonts,
        "slide_size": {"width": size.0, "height": size.1, "aspect": aspect},
        "layouts": layouts,
        "slides": slide_values,
    });
    Ok(Template {
        value,
        slide_text,
        title,
    })
}

/// The slide aspect ratio by its usual name (`16:9`, `4:3`, …), else `W:H` in EMU reduced.
fn aspect((w, h): (i64, i64)) -> Value {
    if w <= 0 || h <= 0 {
        return Value::Null;
    }
    let ratio = w as f64 / h as f64;
    for (name, r) in [("16:9", 16.0 / 9.0), ("4:3", 4.0 / 3.0), ("16:10", 1.6), ("1:1", 1.0)] {
        if (ratio - r).abs() < 0.01 {
            return json!(name);
        }
    }
    json!(format!("{:.3}", ratio))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    const TEMPLATE: &[u8] = include_bytes!("../../tests/fixtures/pptx/template.pptx");

    /// A package of the fixture's parts with `name` replaced by (or added as) `data`, written
    /// deflated.
    fn with_part(name: &str, data: &[u8]) -> Vec<u8> {
        let mut src = zip::ZipArchive::new(Cursor::new(TEMPLATE.to_vec())).unwrap();
        let mut out = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        for i in 0..src.len() {
            let mut f = src.by_index(i).unwrap();
            let part = f.name().unwrap().to_string();
            if part == name {
                continue;
            }
            let mut bytes = Vec::new();
            f.read_to_end(&mut bytes).unwrap();
            out.start_file(part, opts).unwrap();
            out.write_all(&bytes).unwrap();
        }
        out.start_file(name, opts).unwrap();
        out.write_all(data).unwrap();
        out.finish().unwrap().into_inner()
    }

    #[test]
    fn a_template_reads_into_its_design_context() {
        let t = read(TEMPLATE).unwrap();
        let v = &t.value;
        assert_eq!(t.title.as_deref(), Some("Corporate template"));
        assert_eq!(v["theme_name"], "Corporate");
        assert_eq!(v["colors"]["accent1"], "#112233");
        assert_eq!(v["colors"]["dk1"], "#000000", "a system colour by its last value");
        assert_eq!(v["colors"]["dk2"], "#1F2A44");
        assert_eq!(v["fonts"], json!({"heading": "Georgia", "body": "Verdana"}));
        assert_eq!(
            v["slide_size"],
            json!({"width": 12192000, "height": 6858000, "aspect": "16:9"})
        );
        let layouts = v["layouts"].as_array().unwrap();
        let names: Vec<_> = layouts.iter().map(|l| l["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["Title Slide", "Title and Content"]);
        assert_eq!(layouts[0]["type"], "title");
        let title = &layouts[0]["placeholders"][0];
        assert_eq!(title["type"], "ctrTitle");
        assert_eq!(title["position"]["x"], 1524000);
        assert_eq!(title["position"]["relative"]["left"], 0.125);
        // A placeholder without a position of its own takes the master's.
        let subtitle = &layouts[0]["placeholders"][1];
        assert_eq!(
            (subtitle["type"].as_str(), subtitle["idx"].as_u64()),
            (Some("subTitle"), Some(1))
        );
        assert_eq!(subtitle["position"]["y"], 1825625);
        let content = &layouts[1]["placeholders"];
        assert_eq!(content[0]["position"]["y"], 365125);
        assert_eq!(content[1]["type"], "obj");
        assert_eq!(layouts[0]["image"], Value::Null);
        assert_eq!(layouts[1]["image"]["part"], "ppt/media/image1.png");
        assert!(
            layouts[1]["image"]["data_url"]
                .as_str()
                .unwrap()
                .starts_with("data:image/png;base64,iVBOR")
        );
        assert_eq!(
            v["slides"],
            json!([
                {"number": 1, "layout": "Title Slide", "title": "Heat pumps", "text": ["Heat pumps", "For homeowners"]},
                {"number": 2, "layout": "Title and Content", "title": "Why now", "text": ["Why now", "Prices fell\nGrants & rebates"]},
            ])
        );
        assert_eq!(
            t.slide_text,
            [
                "Heat pumps\n\nFor homeowners",
                "Why now\n\nPrices fell\nGrants & rebates"
            ]
        );
    }

    #[test]
    fn malformed_packages_are_typed_errors() {
        assert!(matches!(read(b"not a zip"), Err(PptxError::NotZip(_))));
        assert!(matches!(
            read(&TEMPLATE[..TEMPLATE.len() / 2]),
            Err(PptxError::NotZip(_))
        ));
        let bad = with_part("ppt/theme/theme1.xml", b"<a:theme><unclosed></a:theme>");
        let e = read(&bad).unwrap_err();
        assert!(
            matches!(&e, PptxError::Xml { part, .. } if part == "ppt/theme/theme1.xml"),
            "{e}"
        );
        let bad = with_part("ppt/slides/slide2.xml", &[0xff, 0xfe, 0x00]);
        assert!(matches!(read(&bad), Err(PptxError::Xml { .. })));
        // Relationships to parts that are not there.
        let bad = with_part(
            "ppt/_rels/presentation.xml.rels",
            br#"<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId2" Type="x/slide" Target="slides/nope.xml"/></Relationships>"#,
        );
        let e = read(&bad).unwrap_err();
        assert!(matches!(&e, PptxError::Missing(p) if p == "ppt/slides/nope.xml"), "{e}");
        let mut empty = zip::ZipWriter::new(Cursor::new(Vec::new()));
        empty
            .start_file("a.txt", zip::write::SimpleFileOptions::default())
            .unwrap();
        let empty = empty.finish().unwrap().into_inner();
        assert!(matches!(read(&empty), Err(PptxError::Missing(p)) if p == "ppt/presentation.xml"));
    }

    #[test]
    fn a_zip_bomb_is_refused_by_its_unpacked_size() {
        // 9 MiB of spaces inside a comment: well-formed XML, a few KiB packed.
        let mut xml = b"<?xml version=\"1.0\"?><!--".to_vec();
        xml.resize(xml.len() + (9 << 20), b' ');
        xml.extend_from_slice(b"--><a:theme xmlns:a=\"x\" name=\"T\"/>");
        let bomb = with_part("ppt/theme/theme1.xml", &xml);
        assert!(bomb.len() < 100_000, "{}", bomb.len());
        let e = read(&bomb).unwrap_err();
        assert!(
            matches!(&e, PptxError::TooLarge { part, cap } if part == "ppt/theme/theme1.xml" && *cap == MAX_PART_BYTES),
            "{e}"
        );
    }

    #[test]
    fn a_pptx_is_recognised_and_indexed_as_its_slides_text() {
        use crate::rag::extract::{Format, PAGE_BREAK, extract};
        assert_eq!(Format::sniff(TEMPLATE), Format::Pptx);
        assert_eq!(Format::from_path(std::path::Path::new("deck.PPTX")), Some(Format::Pptx));
        let e = extract(TEMPLATE, Format::Pptx).unwrap();
        assert_eq!(e.title.as_deref(), Some("Corporate template"));
        assert_eq!(e.text.split(PAGE_BREAK).count(), 2, "{}", e.text);
        assert!(e.text.starts_with("Heat pumps\n\nFor homeowners\n"), "{}", e.text);
    }

    #[test]
    fn relationship_targets_resolve_against_the_part() {
        assert_eq!(resolve("ppt/slides", "../slideLayouts/a.xml"), "ppt/slideLayouts/a.xml");
        assert_eq!(resolve("ppt", "slides/s1.xml"), "ppt/slides/s1.xml");
        assert_eq!(resolve("ppt/slides", "/ppt/media/i.png"), "ppt/media/i.png");
        assert_eq!(resolve("ppt", "../../../x"), "x");
    }
}
