"""The TUI's panes and dialogs, each a Textual widget (`cocoviz.tui.app` lays them out)."""
