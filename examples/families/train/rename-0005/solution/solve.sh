#!/bin/bash
mv items.txt total.txt
