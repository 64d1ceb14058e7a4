fn main() {
    print!("{}", runner::spec::schema::generate_text());
}
