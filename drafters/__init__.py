"""Drafter definitions (draft LM, Medusa, EAGLE, EAGLE-3, n-gram): modules, save/load, export."""
