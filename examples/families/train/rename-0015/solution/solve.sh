#!/bin/bash
mv items.txt output.txt
