#!/bin/bash
mv notes.txt out.txt
