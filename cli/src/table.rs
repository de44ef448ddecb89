//! Tables on the terminal: columns sized to their content, numbers aligned right, no borders (so the output stays
//! easy to read and to cut with `awk`).

use comfy_table::{CellAlignment, ContentArrangement, presets};

/// A table being filled.
pub struct Table {
    inner: comfy_table::Table,
    right: Vec<usize>,
}

impl Table {
    /// A table with these column headers.
    pub fn new<const N: usize>(header: [&str; N]) -> Self {
        let mut inner = comfy_table::Table::new();
        inner.load_preset(presets::NOTHING).set_content_arrangement(ContentArrangement::Disabled).set_header(header);
        Table { inner, right: Vec::new() }
    }

    /// Aligns these columns (numbers, by index from 0) to the right.
    pub fn right(mut self, columns: impl IntoIterator<Item = usize>) -> Self {
        self.right.extend(columns);
        self
    }

    /// Adds a row.
    pub fn row<const N: usize>(&mut self, cells: [String; N]) {
        self.inner.add_row(cells);
    }

    /// Prints it, indented by `indent` spaces.
    pub fn print(mut self, indent: usize) {
        for &index in &self.right {
            if let Some(column) = self.inner.column_mut(index) {
                column.set_cell_alignment(CellAlignment::Right);
            }
        }
        let pad = " ".repeat(indent);
        for line in self.inner.lines() {
            println!("{pad}{}", line.trim_end());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_fit_their_content_and_numbers_align_right() {
        let mut table = Table::new(["stream", "messages"]).right([1]);
        table.row(["orders".to_string(), "7".to_string()]);
        table.row(["a".to_string(), "12345678".to_string()]);
        for index in table.right.clone() {
            table.inner.column_mut(index).expect("a column").set_cell_alignment(CellAlignment::Right);
        }
        let lines: Vec<String> = table.inner.lines().map(|line| line.trim_end().to_string()).collect();
        let width = lines[0].len();
        assert!(lines.iter().all(|line| line.len() == width), "{lines:#?}");
        assert!(lines[1].starts_with(" orders") && lines[1].ends_with(" 7"), "{lines:#?}");
    }
}
