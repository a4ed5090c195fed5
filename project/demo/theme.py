"""The demo's admin theme for django-admin-interface: colours, title, and how to install it.

Installed by the migration ``demo.0001_admin_theme`` (so ``migrate`` on a fresh clone gives
the themed admin) and by tests whose database was flushed since.
"""

from __future__ import annotations

from typing import Any

THEME = "Resource leases"

COLOURS = {
    "title": "Resource leases",
    "title_color": "#FFFFFF",
    # The title says what this admin is for; Django's logo would only crowd it.
    "logo_visible": False,
    "env_name": "demo",
    "env_color": "#3498DB",
    "language_chooser_active": False,
    "css_header_background_color": "#1F2A37",
    "css_header_text_color": "#E5E7EB",
    "css_header_link_color": "#FFFFFF",
    "css_header_link_hover_color": "#93C5FD",
    "css_module_background_color": "#1565C0",
    "css_module_background_selected_color": "#E3F2FD",
    "css_module_text_color": "#FFFFFF",
    "css_module_link_color": "#FFFFFF",
    "css_module_link_selected_color": "#FFFFFF",
    "css_module_link_hover_color": "#BBDEFB",
    "css_generic_link_color": "#0D47A1",
    "css_generic_link_hover_color": "#1565C0",
    "css_generic_link_active_color": "#0D47A1",
    "css_save_button_background_color": "#1565C0",
    "css_save_button_background_hover_color": "#0D47A1",
    "css_save_button_text_color": "#FFFFFF",
    "css_delete_button_background_color": "#C62828",
    "css_delete_button_background_hover_color": "#8E0000",
    "css_delete_button_text_color": "#FFFFFF",
    "list_filter_dropdown": False,
    "related_modal_active": True,
}


def install(theme_model: Any, using: str = "default") -> None:
    """Create (or update) the theme and make it the only active one.

    ``theme_model`` is ``admin_interface.models.Theme`` or its historical version in a
    migration, which sends none of the app's signals: "one active theme" is kept by hand.
    """
    themes = theme_model.objects.using(using)
    themes.exclude(name=THEME).update(active=False)
    themes.update_or_create(name=THEME, defaults={**COLOURS, "active": True})
